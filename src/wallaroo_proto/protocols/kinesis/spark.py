"""spark-replay reports over the Kinesis rows of ``frames`` (as ``dissect --summary`` counts them).

Each builder gets only this protocol's rows. A shard is one connection's
conversation; latency is the daemon's request to the processor's status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .codec import REQUESTS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CONN = ("capture", "connection", "conn_index")


def shards(frames: DataFrame) -> DataFrame:
    """Per shard: records, requests, checkpoints and their errors, request-to-status latency, violations."""
    from pyspark.sql import functions as F  # noqa: N812

    accepted = F.col("verdict") == "accepted"
    reply = accepted & (F.col("type") == "checkpoint") & (F.col("sender") == "daemon")
    return (
        frames.groupBy(*CONN)
        .agg(
            F.max("shard_id").alias("shard_id"),
            F.coalesce(
                F.sum(F.when(accepted & (F.col("type") == "processRecords"), F.col("record_count"))), F.lit(0)
            ).alias("records"),
            F.count(
                F.when(accepted & (F.col("sender") == "daemon") & F.col("type").isin(*REQUESTS), 1)
            ).alias("requests"),
            F.count(F.when(reply & F.col("checkpoint_error").isNull(), 1)).alias("checkpoints"),
            F.count(F.when(reply & F.col("checkpoint_error").isNotNull(), 1)).alias("checkpoint_errors"),
            F.percentile_approx("latency", 0.5, 1_000_000).alias("latency_p50"),
            F.percentile_approx("latency", 0.99, 1_000_000).alias("latency_p99"),
            F.max("latency").alias("latency_max"),
            F.count(F.when(F.col("verdict") == "violation", 1)).alias("violations"),
        )
        .orderBy(*CONN)
    )


def violations(frames: DataFrame) -> DataFrame:
    """Every violation with the line where it happened."""
    from pyspark.sql import functions as F  # noqa: N812

    return (
        frames.where(F.col("verdict") == "violation")
        .select(
            *CONN,
            "shard_id",
            "packet",
            "offset",
            "line_number",
            "sender",
            "type",
            F.explode_outer("violations").alias("reason"),
        )
        .orderBy("capture", "conn_index", "packet")
    )
