"""spark-replay reports over the AMBROSIA rows of ``frames`` (as ``dissect --summary`` counts them).

A pair is one LB's two sockets (the ``lb`` field names it); each builder gets only this protocol's rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def pairs(frames: DataFrame) -> DataFrame:
    """Per LB: records, replayed records, RPCs each way, checkpoints, requests, violations."""
    from pyspark.sql import functions as F  # noqa: N812

    ic = F.col("sender") == "ic"
    lb = F.col("sender") == "lb"
    return (
        frames.groupBy("capture", "lb")
        .agg(
            F.min("conn_index").alias("first_conn"),
            F.max("committer_id").alias("committer_id"),
            F.count(F.when(ic & (F.col("type") == "Record"), 1)).alias("records"),
            F.count(F.when(F.col("verdict") == "replayed", 1)).alias("replayed"),
            F.coalesce(F.sum(F.when(ic, F.col("rpc_count"))), F.lit(0)).alias("rpcs_to_lb"),
            F.coalesce(F.sum(F.when(lb, F.col("rpc_count"))), F.lit(0)).alias("rpcs_from_lb"),
            F.count(F.when(ic & (F.col("type") == "CheckpointRecord"), 1)).alias("recoveries"),
            F.count(F.when(lb & (F.col("type") == "Checkpoint"), 1)).alias("checkpoints"),
            F.max(F.when(ic, F.col("seq_id"))).alias("last_seq"),
            F.count(F.when(F.col("verdict") == "violation", 1)).alias("violations"),
        )
        .orderBy("capture", "first_conn")
    )


def violations(frames: DataFrame) -> DataFrame:
    """Every violation with the record or message where it happened."""
    from pyspark.sql import functions as F  # noqa: N812

    return (
        frames.where(F.col("verdict") == "violation")
        .select(
            "capture",
            "lb",
            "conn_index",
            "packet",
            "offset",
            "sender",
            "type",
            "seq_id",
            F.explode_outer("violations").alias("reason"),
        )
        .orderBy("capture", "conn_index", "packet")
    )
