"""spark-replay reports over the DCP rows of ``frames`` (as ``dissect --summary`` counts them).

Each builder gets only this protocol's rows. A stream is one vbucket on one connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CONN = ("capture", "connection", "conn_index")
ITEMS = ("DCP_MUTATION", "DCP_DELETION", "DCP_EXPIRATION")


def vbuckets(frames: DataFrame) -> DataFrame:
    """Per connection and vbucket: items by kind, snapshots begun and done, last seqno, rollbacks, ends."""
    from pyspark.sql import functions as F  # noqa: N812

    accepted = F.col("verdict") == "accepted"
    kind = F.col("type")
    return (
        frames.where(F.col("vbucket").isNotNull())
        .groupBy(*CONN, "vbucket")
        .agg(
            F.count(F.when(kind == "DCP_MUTATION", 1)).alias("mutations"),
            F.count(F.when(kind == "DCP_DELETION", 1)).alias("deletions"),
            F.count(F.when(kind == "DCP_EXPIRATION", 1)).alias("expirations"),
            F.count(F.when(kind == "DCP_SNAPSHOT_MARKER", 1)).alias("snapshots"),
            F.count(F.when(F.col("dcp_event") == "snapshot complete", 1)).alias("snapshots_complete"),
            F.max(F.when(accepted & kind.isin(*ITEMS), F.col("seqno"))).alias("last_seqno"),
            F.count(F.when(F.col("rollback_seqno").isNotNull(), 1)).alias("rollbacks"),
            F.concat_ws(",", F.collect_list("end_reason")).alias("stream_ends"),
            F.count(F.when(F.col("verdict") != "accepted", 1)).alias("violations"),
        )
        .orderBy(*CONN, "vbucket")
    )


def flow_control(frames: DataFrame) -> DataFrame:
    """Per connection: the buffer size, bytes acknowledged, stalls (buffer full), peak unacknowledged."""
    from pyspark.sql import functions as F  # noqa: N812

    return (
        frames.groupBy(*CONN)
        .agg(
            F.max(F.when(F.col("control_key") == "connection_buffer_size", F.col("control_value"))).alias(
                "buffer_size"
            ),
            F.coalesce(F.sum("ack_bytes"), F.lit(0)).alias("acked_bytes"),
            F.count(F.when(F.col("type") == "DCP_BUFFER_ACKNOWLEDGEMENT", 1)).alias("acks"),
            F.count(F.when(F.col("dcp_event") == "buffer full", 1)).alias("stalls"),
            F.max("outstanding").alias("peak_outstanding"),
            F.count(F.when(F.col("type") == "DCP_NOOP", 1)).alias("noops"),
        )
        .orderBy(*CONN)
    )


def violations(frames: DataFrame) -> DataFrame:
    """Every violation with the packet where it happened."""
    from pyspark.sql import functions as F  # noqa: N812

    return (
        frames.where(F.col("verdict") != "accepted")
        .select(
            *CONN,
            "vbucket",
            "packet",
            "offset",
            "sender",
            "type",
            "opaque",
            F.explode_outer("violations").alias("reason"),
        )
        .orderBy("capture", "conn_index", "packet")
    )
