"""DCP_CONTROL: the keys and values a producer takes, judged as a data node's producer does (sans-IO).

The rules follow kv_engine's ``DcpProducer::control``: a number is read as the
server's C parsers read it (``safe_strtoul`` for ``connection_buffer_size``, a
u32; ``safe_strtof`` for ``set_noop_interval``, a float of at least the
connection manager's 0.1 s), words must be ones the server knows, and keys it
does not know are EINVAL. Where the server would take a value it cannot use
(an infinite noop interval, whose conversion to milliseconds is undefined),
this answers EINVAL too.
"""

from __future__ import annotations

import math
import re
import struct

from .codec import EINVAL, NOT_SUPPORTED, SUCCESS

#: The smallest noop interval a producer takes: its connection manager's interval (seconds).
MIN_NOOP_INTERVAL = 0.1
#: The largest: the interval is kept in milliseconds as a signed 64-bit count.
MAX_NOOP_INTERVAL = (2**63 - 1) / 1000
_U32_MAX = 0xFFFF_FFFF
_C_SPACE = " \t\n\v\f\r"
# What C's isspace() skips, then digits, then the end or a space (after which anything may follow).
_U32 = re.compile(r"[ \t\n\v\f\r]*\+?([0-9]+)(?:[ \t\n\v\f\r]|\Z)")
# strtof's longest prefix: hex or decimal float, inf/infinity, nan(...), after leading spaces.
_FLOAT = re.compile(
    r"[ \t\n\v\f\r]*([+-]?)(?:"
    r"(0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?[0-9]+)?)"
    r"|((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)"
    r"|(inf(?:inity)?)"
    r"|(nan(?:\([0-9a-z_]*\))?))",
    re.IGNORECASE,
)
_F32 = struct.Struct("f")
_WORDS = {
    "backfill_order": ("round-robin", "sequential"),
    "set_priority": ("high", "medium", "low"),
    "enable_stream_id": ("true",),
    "v7_dcp_status_codes": ("true",),
    "flatbuffers_system_events": ("true",),
    "enable_out_of_order_snapshots": ("true", "true_with_seqno_advanced"),
}
#: Keys whose value is a flag the server takes whatever it says ("true" turns it on).
_ANY_VALUE = frozenset(
    (
        "enable_noop",
        "supports_cursor_dropping",
        "supports_cursor_dropping_vulcan",
        "supports_hifi_MFU",
        "send_stream_end_on_client_close_stream",
        "enable_expiry_opcode",
    )
)
#: Keys a data node of default configuration answers NOT_SUPPORTED, whatever the value (per-stream
#: buffers are gone, cache transfer is off), and those it answers so for one value: history retention
#: (couchstore has none) and snapshot marker 2.2 (needs collections, which this producer does not do).
_NOT_SUPPORTED = frozenset(("stream_buffer_size", "cache_transfer"))
_NOT_SUPPORTED_FOR = {"change_streams": "true", "max_marker_version": "2.2"}


def parse_u32(value: str) -> int | None:
    """The number ``safe_strtoul`` reads: leading spaces, an optional +, digits, then the end or a space."""
    m = _U32.match(value)
    if m is None:
        return None
    n = int(m.group(1))
    return n if n <= _U32_MAX else None


def parse_float(value: str) -> float | None:
    """The float ``safe_strtof`` reads (a C float: None when it overflows), or None."""
    m = _FLOAT.match(value)
    if m is None:
        return None
    rest = value[m.end() :]
    if rest and rest[0] not in _C_SPACE:
        return None
    sign, hexa, dec, inf, _nan = m.groups()
    if inf:
        x = math.inf
    elif hexa or dec:
        x = float.fromhex(hexa) if hexa else float(dec)
        if math.isinf(x):
            return None  # ERANGE
    else:
        x = math.nan
    try:
        x = _F32.unpack(_F32.pack(-x if sign == "-" else x))[0]
    except OverflowError:
        return None  # ERANGE: beyond a C float
    return x


def noop_interval(value: str) -> float | None:
    """The noop interval in seconds ``set_noop_interval=value`` sets, or None when it is refused."""
    x = parse_float(value)
    if x is None or not math.isfinite(x) or x < _F32.unpack(_F32.pack(MIN_NOOP_INTERVAL))[0]:
        return None
    return x if x <= MAX_NOOP_INTERVAL else None


def control_status(key: str, value: str) -> int:
    """The status a producer answers DCP_CONTROL ``key=value`` with."""
    if key in _ANY_VALUE:
        return SUCCESS
    if key in _NOT_SUPPORTED or _NOT_SUPPORTED_FOR.get(key) == value:
        return NOT_SUPPORTED
    if key == "connection_buffer_size":
        return SUCCESS if parse_u32(value) is not None else EINVAL
    if key == "set_noop_interval":
        return SUCCESS if noop_interval(value) is not None else EINVAL
    if key == "consumer_name":
        return SUCCESS if value else EINVAL
    if key in _WORDS:
        return SUCCESS if value in _WORDS[key] else EINVAL
    return EINVAL
