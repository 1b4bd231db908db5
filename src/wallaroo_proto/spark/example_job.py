"""An example ``--job``: how many messages each key had per event-time window.

Run it with::

    wallaroo-proto spark-replay captures/ --job wallaroo_proto.spark.example_job:key_counts

It takes the ``messages`` view's DataFrame and returns one row per (window, key):
``window_start``, ``window_end`` (UTC timestamps), ``key`` (text; null for messages
without a key) and ``messages``. Event times are read as milliseconds since the
epoch, which is what mock-source and the shipped connectors send; a time Spark
cannot hold as milliseconds (nanoseconds, say) counts in a null window rather than
failing the run. Each message
is counted once: the copies a worker dropped as replays are left out, and so
are resends after a reconnect (a stream's message id names one message, so
rows are de-duplicated on capture, stream and message id).

Copy this file to write your own job: a function from a DataFrame to a DataFrame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Tumbling windows of this length (any Spark interval string).
WINDOW = "10 seconds"
#: Milliseconds since the epoch that Spark's timestamps hold: years 1 to 9999.
MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)


def windowed_key_counts(messages: DataFrame, window: str = WINDOW) -> DataFrame:
    """Per-key message counts in tumbling event-time windows of ``window``."""
    from pyspark.sql import functions as F  # noqa: N812

    once = messages.where(F.col("verdict") != "replayed").dropDuplicates(
        ["capture", "use", "stream_id", "message_id"]
    )
    in_range = F.col("event_time").between(*MS_RANGE)
    windowed = (
        once.where(in_range)
        .groupBy(F.window(F.timestamp_millis("event_time"), window).alias("w"), "key")
        .agg(F.count("*").alias("messages"))
        .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "key", "messages")
    )
    unwindowed = (  # Spark's window() drops rows whose time is null: counted here instead
        once.where(~in_range)
        .groupBy("key")
        .agg(F.count("*").alias("messages"))
        .select(
            F.lit(None).cast("timestamp").alias("window_start"),
            F.lit(None).cast("timestamp").alias("window_end"),
            "key",
            "messages",
        )
    )
    return windowed.unionByName(unwindowed).orderBy("window_start", "key")


def key_counts(messages: DataFrame) -> DataFrame:
    """The ``--job`` entry point: ``windowed_key_counts`` with 10-second windows."""
    return windowed_key_counts(messages)
