"""wallaroo-proto: a toolkit for streaming-connector protocols (Wallaroo v3, Kinesis MLD, Couchbase DCP,
AMBROSIA, Tremor).

The names here are what every protocol shares: the judge contract each core keeps, the
plug-in registry and the frame record's vocabulary and schema. Each protocol's own API is its
package's (``wallaroo_proto.protocols.wallaroo``, ...); the capture driver is
``wallaroo_proto.capture.dissector``'s. Only light modules are imported here: every module of
the package (a mock peer, a Spark executor) loads this first.
"""

from .judge import End, Expected, Judge, Kind, Verdict
from .protocols import ProtocolPlugin, get_plugin, names, plugins
from .protocols.schema import field_names, field_types, fields, spark_schema, table_names
from .records import COMMON_FIELDS, ConnectionKey, Field, flow_hash, to_json

__version__ = "0.1.0"

__all__ = [
    "COMMON_FIELDS",
    "ConnectionKey",
    "End",
    "Expected",
    "Field",
    "Judge",
    "Kind",
    "ProtocolPlugin",
    "Verdict",
    "field_names",
    "field_types",
    "fields",
    "flow_hash",
    "get_plugin",
    "names",
    "plugins",
    "spark_schema",
    "table_names",
    "to_json",
]
