"""SASL as a data node's server side does it: PLAIN and SCRAM-SHA1/256/512 (RFC 5802, RFC 7677), sans-IO.

One ``Account`` (user, password) is what a proof is checked against; the salted
password and keys are made once per mechanism. A ``ScramServer`` is one
exchange: ``first`` takes the client-first message and gives the server-first
(AUTH_CONTINUE), ``final`` takes the client-final and gives the server-final
with the server's signature, or raises ``AuthFailed``. The proof check is the
RFC's: the client key recovered from the proof must hash to the stored key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

#: The mechanisms a data node lists on a plain (non-TLS) connection, strongest first, then PLAIN.
MECHANISMS = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")
_HASHES = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}
ITERATIONS = 4096


class AuthFailed(Exception):
    """The client's message is malformed or its proof is wrong; the text says which."""


@dataclass
class _Keys:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass
class Account:
    user: str
    password: str
    iterations: int = ITERATIONS
    _keys: dict[str, _Keys] = field(default_factory=dict, repr=False)

    def keys(self, mechanism: str, salt: bytes | None = None) -> _Keys:
        """The salted keys for ``mechanism`` (made once; ``salt`` fixes the salt, for test vectors)."""
        keys = self._keys.get(mechanism)
        if keys is None or (salt is not None and keys.salt != salt):
            name = _HASHES[mechanism]
            salt = salt if salt is not None else secrets.token_bytes(16)
            salted = hashlib.pbkdf2_hmac(name, self.password.encode(), salt, self.iterations)
            client_key = hmac.digest(salted, b"Client Key", name)
            keys = _Keys(
                salt,
                self.iterations,
                hashlib.new(name, client_key).digest(),
                hmac.digest(salted, b"Server Key", name),
            )
            self._keys[mechanism] = keys
        return keys

    def plain(self, message: bytes) -> str:
        """Check a PLAIN message (authzid NUL user NUL password); the user, or AuthFailed."""
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("PLAIN: not authzid, user and password separated by NUL")
        user, password = (p.decode("utf-8", "replace") for p in parts[1:])
        if user != self.user or not hmac.compare_digest(password.encode(), self.password.encode()):
            raise AuthFailed(f"PLAIN: wrong user or password for {user!r}")
        return user


def _attributes(message: str) -> dict[str, str]:
    out = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthFailed(f"SCRAM: {part!r} is no attribute")
        out.setdefault(part[0], part[2:])
    return out


def _username(raw: str) -> str:
    if "=" in raw.replace("=2C", "").replace("=3D", ""):
        raise AuthFailed("SCRAM: a user name with '=' not escaped as =2C or =3D")
    return raw.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange for ``account`` with ``mechanism`` (SCRAM-SHA512, -SHA256 or -SHA1)."""

    def __init__(
        self, account: Account, mechanism: str, nonce: str | None = None, salt: bytes | None = None
    ) -> None:
        if mechanism not in _HASHES:
            raise AuthFailed(f"{mechanism}: not a SCRAM mechanism")
        self.account = account
        self.mechanism = mechanism
        self.hash = _HASHES[mechanism]
        self.keys = account.keys(mechanism, salt)
        self.server_nonce = nonce if nonce is not None else base64.b64encode(secrets.token_bytes(18)).decode()
        self.gs2_header = ""
        self.client_first_bare = ""
        self.server_first = ""
        self.user = ""

    def first(self, message: bytes) -> bytes:
        """The server-first message for the client-first ``message``."""
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("SCRAM: client-first message is not UTF-8") from None
        cbind, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if cbind not in ("n", "y") or not bare:
            raise AuthFailed("SCRAM: client-first message must start n,, or y,, (no channel binding)")
        attrs = _attributes(bare)
        if "n" not in attrs or not attrs.get("r"):
            raise AuthFailed("SCRAM: client-first message without a user (n=) or nonce (r=)")
        self.user = _username(attrs["n"])
        self.gs2_header = f"{cbind},{authzid},"
        self.client_first_bare = bare
        nonce = attrs["r"] + self.server_nonce
        salt = base64.b64encode(self.keys.salt).decode()
        self.server_first = f"r={nonce},s={salt},i={self.keys.iterations}"
        return self.server_first.encode()

    def final(self, message: bytes) -> bytes:
        """The server-final message (``v=`` the server signature) once the proof checks; else AuthFailed."""
        if not self.server_first:
            raise AuthFailed("SCRAM: a final message before the first")
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("SCRAM: client-final message is not UTF-8") from None
        without_proof, sep, proof_attr = text.rpartition(",p=")
        if not sep:
            raise AuthFailed("SCRAM: client-final message without a proof (p=)")
        attrs = _attributes(without_proof)
        if attrs.get("c") != base64.b64encode(self.gs2_header.encode()).decode():
            raise AuthFailed("SCRAM: channel binding (c=) does not repeat the client-first header")
        if attrs.get("r") != _attributes(self.server_first)["r"]:
            raise AuthFailed("SCRAM: nonce (r=) is not the one the server gave")
        try:
            proof = base64.b64decode(proof_attr, validate=True)
        except ValueError:
            raise AuthFailed("SCRAM: proof (p=) is not base64") from None
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        signature = hmac.digest(self.keys.stored_key, auth_message, self.hash)
        if len(proof) != len(signature):
            raise AuthFailed(f"SCRAM: proof of {len(proof)} bytes, {self.mechanism} gives {len(signature)}")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if self.user != self.account.user or not hmac.compare_digest(
            hashlib.new(self.hash, client_key).digest(), self.keys.stored_key
        ):
            raise AuthFailed(f"{self.mechanism}: wrong user or password for {self.user!r}")
        server_signature = hmac.digest(self.keys.server_key, auth_message, self.hash)
        return b"v=" + base64.b64encode(server_signature)


def plain_message(user: str, password: str) -> bytes:
    """PLAIN's one message: no authzid, the user, the password."""
    return b"\0" + user.encode() + b"\0" + password.encode()


def choose(offered: list[str]) -> str | None:
    """The mechanism a client picks from the server's list: the strongest SCRAM, else PLAIN, else None."""
    return next((m for m in MECHANISMS if m in offered), None)


class ScramClient:
    """The client's side of one SCRAM exchange: ``first``, ``final`` of the server-first, ``verify``."""

    def __init__(self, user: str, password: str, mechanism: str, nonce: str | None = None) -> None:
        if mechanism not in _HASHES:
            raise AuthFailed(f"{mechanism}: not a SCRAM mechanism")
        self.user, self.password, self.mechanism = user, password, mechanism
        self.hash = _HASHES[mechanism]
        self.nonce = nonce if nonce is not None else base64.b64encode(secrets.token_bytes(18)).decode()
        name = user.replace("=", "=3D").replace(",", "=2C")
        self.client_first_bare = f"n={name},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        """The client-first message (no channel binding)."""
        return f"n,,{self.client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final message with the proof, for the server-first; AuthFailed if that is wrong."""
        try:
            text = server_first.decode("utf-8")
            attrs = _attributes(text)
            salt = base64.b64decode(attrs["s"], validate=True)
            iterations = int(attrs["i"])
        except (UnicodeDecodeError, KeyError, ValueError):
            raise AuthFailed("SCRAM: server-first message without a nonce, salt or iteration count") from None
        if not attrs.get("r", "").startswith(self.nonce) or iterations < 1:
            raise AuthFailed("SCRAM: server nonce does not extend ours, or no iterations")
        salted = hashlib.pbkdf2_hmac(self.hash, self.password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self.hash)
        stored_key = hashlib.new(self.hash, client_key).digest()
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
        auth_message = f"{self.client_first_bare},{text},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self.hash)
        self.server_signature = hmac.digest(server_key, auth_message, self.hash)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature (``v=``): a server that knows the password; else AuthFailed."""
        expected = b"v=" + base64.b64encode(self.server_signature)
        if not self.server_signature or not hmac.compare_digest(server_final, expected):
            raise AuthFailed(f"{self.mechanism}: the server's signature is wrong")
