"""GET_ERROR_MAP's answer: what each status this producer can send means, in the server's JSON form.

A client that negotiated XERROR asks for the map (its value: the highest map
version it reads, 2 bytes) and learns from each code's attributes how to react
to a status it does not know by number (``fetch-config``: get the cluster map
again; ``conn-state-invalidated``: reconnect; ``retry-now``...). The server
answers the version asked for, at most its newest (2); version 1 is the same
map with a revision 4 higher and only the attributes version 1 defines; version
0 has no map (KEY_ENOENT). This map lists only the statuses this producer sends.
"""

from __future__ import annotations

import json

from . import codec

#: The map's revision (of its version-2 form).
REVISION = 1
NEWEST = 2
#: Attributes a version-1 map may carry (the server strips the others from its version-2 map).
V1_ATTRIBUTES = frozenset(
    (
        "item-deleted",
        "item-locked",
        "item-only",
        "invalid-input",
        "fetch-config",
        "conn-state-invalidated",
        "auth",
        "special-handling",
        "support",
        "temp",
        "internal",
        "retry-now",
        "retry-later",
        "subdoc",
        "dcp",
        "success",
    )
)

#: status -> (name, description, attributes), for every status this producer sends.
ERRORS: dict[int, tuple[str, str, tuple[str, ...]]] = {
    codec.SUCCESS: ("SUCCESS", "Success", ("success",)),
    codec.KEY_ENOENT: ("KEY_ENOENT", "No such key, bucket or stream", ("item-only",)),
    codec.KEY_EEXISTS: ("KEY_EEXISTS", "A stream for this vbucket is already open", ("item-only",)),
    codec.EINVAL: ("EINVAL", "The request is malformed or not allowed here", ("internal", "invalid-input")),
    codec.NOT_MY_VBUCKET: (
        "NOT_MY_VBUCKET",
        "This node does not hold the vbucket; the body has the bucket config",
        ("fetch-config", "invalid-input"),
    ),
    codec.NO_BUCKET: ("NO_BUCKET", "No bucket selected", ("conn-state-invalidated",)),
    codec.AUTH_ERROR: ("AUTH_ERROR", "Authentication failed", ("conn-state-invalidated", "auth")),
    codec.AUTH_CONTINUE: ("AUTH_CONTINUE", "Send the next SASL step", ("special-handling",)),
    codec.ERANGE: ("ERANGE", "The seqno range asked for is invalid", ("invalid-input",)),
    codec.ROLLBACK: ("ROLLBACK", "Roll back to the seqno in the body", ("dcp", "special-handling")),
    codec.EACCESS: ("EACCESS", "Not allowed before authentication", ("support",)),
    codec.UNKNOWN_COMMAND: ("UNKNOWN_COMMAND", "Unknown command", ("support",)),
    codec.NOT_SUPPORTED: ("NOT_SUPPORTED", "Not supported by this node", ("support",)),
    codec.STREAMID_INVALID: (
        "DCP stream-ID invalid",
        "Stream ids used where not enabled, or missing where enabled",
        ("invalid-input",),
    ),
}


def error_map(version: int) -> bytes | None:
    """The map in ``version`` (at most the newest), or None for version 0 (the server's KEY_ENOENT)."""
    if version < 1:
        return None
    version = min(version, NEWEST)
    errors = {
        f"{code:x}": {
            "name": name,
            "desc": desc,
            "attrs": [a for a in attrs if version > 1 or a in V1_ATTRIBUTES],
        }
        for code, (name, desc, attrs) in ERRORS.items()
    }
    revision = REVISION if version == NEWEST else REVISION + 4
    return json.dumps({"version": version, "revision": revision, "errors": errors}).encode()
