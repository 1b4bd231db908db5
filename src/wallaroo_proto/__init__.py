"""wallaroo-proto: a toolkit for streaming-connector protocols (Wallaroo v3, Kinesis MLD, Couchbase DCP,
AMBROSIA, Tremor).

The names here are what every protocol shares: the judge contract each core keeps, the
plug-in registry, the frame record's vocabulary and schema, and the capture driver. Each
protocol's own API is its package's (``wallaroo_proto.protocols.wallaroo``, ...).
"""

from .capture.dissector import Dissector, dissect, iter_records
from .capture.pcap import CaptureError
from .judge import End, Expected, Judge, Kind, Verdict
from .protocols import ProtocolPlugin, get_plugin, names, plugins
from .protocols.schema import field_names, field_types, fields, spark_schema, table_names
from .records import COMMON_FIELDS, ConnectionKey, Field, flow_hash, to_json

__version__ = "0.1.0"

__all__ = [
    "COMMON_FIELDS",
    "CaptureError",
    "ConnectionKey",
    "Dissector",
    "End",
    "Expected",
    "Field",
    "Judge",
    "Kind",
    "ProtocolPlugin",
    "Verdict",
    "dissect",
    "field_names",
    "field_types",
    "fields",
    "flow_hash",
    "get_plugin",
    "iter_records",
    "names",
    "plugins",
    "spark_schema",
    "table_names",
    "to_json",
]
