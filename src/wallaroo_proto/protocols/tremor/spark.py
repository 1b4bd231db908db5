"""spark-replay reports over the Tremor rows of ``frames`` (as ``dissect --summary`` counts them).

A session is one connection; a stream is an alias within it. Messages are
the frames that complete a JSON text message (``message_json`` set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CONN = ("capture", "connection", "conn_index")


def sessions(frames: DataFrame) -> DataFrame:
    """Per session: upgrade target and status, frames, messages each way, streams, error close, violations."""
    from pyspark.sql import functions as F  # noqa: N812

    message = F.col("message_json").isNotNull()
    return (
        frames.groupBy(*CONN)
        .agg(
            F.max("http_target").alias("target"),
            F.max("http_status").alias("http_status"),
            F.count(F.when(F.col("ws_payload_len").isNotNull(), 1)).alias("frames"),
            F.count(F.when(message & (F.col("sender") == "client"), 1)).alias("client_messages"),
            F.count(F.when(message & (F.col("sender") == "server"), 1)).alias("server_messages"),
            F.count(F.when((F.col("type") == "connect") & (F.col("verdict") == "accepted"), 1)).alias(
                "connects"
            ),
            F.max(F.when(F.col("type") == "error-close", F.col("message_json"))).alias("error_close"),
            F.count(F.when(F.col("verdict") == "violation", 1)).alias("violations"),
        )
        .orderBy(*CONN)
    )


def streams(frames: DataFrame) -> DataFrame:
    """Per stream (alias) of a session: its sub-protocol and messages each way."""
    from pyspark.sql import functions as F  # noqa: N812

    return (
        frames.where(F.col("alias").isNotNull())
        .groupBy(*CONN, "alias")
        .agg(
            F.max("tremor_protocol").alias("protocol"),
            F.count(
                F.when((F.col("sender") == "client") & ~F.col("type").isin("connect", "disconnect"), 1)
            ).alias("client_messages"),
            F.count(
                F.when(
                    (F.col("sender") == "server") & ~F.col("type").isin("connect-ack", "disconnect-ack"), 1
                )
            ).alias("server_messages"),
            F.count(F.when(F.col("type") == "disconnect-ack", 1)).alias("disconnected"),
            F.min("frame_index").alias("first_frame"),
            F.max("frame_index").alias("last_frame"),
            F.count(F.when(F.col("verdict") == "violation", 1)).alias("violations"),
        )
        .orderBy(*CONN, "first_frame")
    )


def messages(frames: DataFrame) -> DataFrame:
    """Every JSON message with its judged type, alias and verdict."""
    from pyspark.sql import functions as F  # noqa: N812

    return (
        frames.where(F.col("message_json").isNotNull())
        .select(
            *CONN,
            "frame_index",
            "packet",
            "ts",
            "sender",
            "type",
            "alias",
            "tremor_protocol",
            "status_code",
            "message_json",
            "verdict",
        )
        .orderBy(*CONN, "frame_index")
    )


def violations(frames: DataFrame) -> DataFrame:
    """Every violation (HTTP upgrade, WebSocket framing, session rules) with the frame where it happened."""
    from pyspark.sql import functions as F  # noqa: N812

    return (
        frames.where(F.col("verdict") == "violation")
        .select(
            *CONN,
            "packet",
            "offset",
            "frame_index",
            "sender",
            "type",
            F.explode_outer("violations").alias("reason"),
        )
        .orderBy("capture", "conn_index", "packet")
    )
