"""spark-replay reports over the Wallaroo rows of ``frames`` (as ``dissect --summary`` counts them).

Every report follows the dissector's definitions (``dissect --summary``), so the
two agree on the same capture; what the dissector's summary does not have
(out-of-order ids, zero-credit time, replays after a reconnect, 2PC timings) is
defined in the docstrings here. A connection is identified by
``(capture, connection, conn_index)``; a stream by that and ``stream_id``.
Frames of one connection are ordered by ``frame_index`` (both directions, as
the protocol core saw them). Each builder gets only this protocol's rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CONN = ("capture", "connection", "conn_index")
STREAM = (*CONN, "stream_id")
#: Unsigned 64-bit protocol values (ids, points of reference) as the reports see them: exact
#: decimals (``spark.reports.exact``; the tables hold them as a ``long`` of their 64 bits).
U64 = "decimal(20,0)"


def _f():
    from pyspark.sql import functions as F  # noqa: N812

    return F


def _window(*partition: str):
    from pyspark.sql import Window

    return Window.partitionBy(*partition)


def app_messages(frames: DataFrame) -> DataFrame:
    """MESSAGE frames that carry application data (not 2PC on a sink's stream 0)."""
    F = _f()  # noqa: N806
    return frames.where((F.col("type") == "MESSAGE") & F.col("twopc").isNull())


def messages(frames: DataFrame) -> DataFrame:
    """The application messages: stream, message id, event time, key, payload, and where they were.

    ``key`` is the key as UTF-8 text (null when there is no key); ``key_b64`` keeps the exact
    bytes. ``payload`` is binary. ``event_time`` is as sent (mock-source: milliseconds since the
    epoch). ``verdict`` is the protocol core's: ``replayed`` messages were dropped by the worker.
    """
    F = _f()  # noqa: N806
    return app_messages(frames).select(
        "capture",
        "connection",
        "conn_index",
        "use",
        "stream_id",
        "message_id",
        "event_time",
        F.when(F.col("key_len") > 0, F.decode(F.unbase64("key_b64"), "UTF-8")).alias("key"),
        "key_b64",
        F.unbase64("payload_b64").alias("payload"),
        "payload_len",
        "ts",
        "packet",
        "frame_index",
        "verdict",
    )


def audit(frames: DataFrame) -> DataFrame:
    """Delivery audit per stream of each connection, with the dissector summary's definitions.

    messages, bytes, first_id, last_id: accepted application messages (bytes = payload bytes);
    gaps / missing_ids: an accepted id above the expected next one (last id + 1 on a source
    stream, last id + payload length on a sink stream, where ids are byte offsets), counted
    from each NOTIFY_ACK afresh; replays: messages the core dropped as not above the last id;
    out_of_order: those of the replays whose id was never delivered before on the stream (so
    not a resend but a reordering); last_checkpoint: the last ACK point of reference for the
    stream (source), or the end of the last committed 2PC range (sink); eos: EOS_MESSAGEs.
    """
    F = _f()  # noqa: N806
    app = app_messages(frames)
    seq_source = frames.where(
        ((F.col("type") == "MESSAGE") & F.col("twopc").isNull() & (F.col("verdict") == "accepted"))
        | (F.col("type") == "NOTIFY_ACK")
    ).select(
        *STREAM,
        "use",
        "frame_index",
        "type",
        "message_id",
        "payload_len",
    )
    by_stream = _window(*STREAM).orderBy("frame_index")
    epochs = seq_source.withColumn(
        "epoch", F.sum(F.when(F.col("type") == "NOTIFY_ACK", 1).otherwise(0)).over(by_stream)
    ).where(F.col("type") == "MESSAGE")
    by_epoch = _window(*STREAM, "epoch").orderBy("frame_index")
    step = F.when(F.col("use") == "sink", F.col("message_id") + F.col("payload_len")).otherwise(
        F.col("message_id") + 1
    )
    gaps = (
        epochs.withColumn("expected", F.lag(step).over(by_epoch))
        .withColumn(
            "missing",
            F.when(F.col("message_id") > F.col("expected"), F.col("message_id") - F.col("expected")).cast(
                "long"
            ),
        )
        .groupBy(*STREAM)
        .agg(
            F.count("missing").alias("gaps"),
            F.coalesce(F.sum("missing"), F.lit(0)).alias("missing_ids"),
        )
    )
    accepted = app.where(F.col("verdict") == "accepted")
    delivered = accepted.groupBy(*STREAM).agg(
        F.first("use").alias("use"),
        F.count("*").alias("messages"),
        F.sum("payload_len").alias("bytes"),
        F.min_by("message_id", "frame_index").alias("first_id"),
        F.max_by("message_id", "frame_index").alias("last_id"),
    )
    replayed = app.where(F.col("verdict") == "replayed")
    seen_ids = accepted.select(*STREAM, "message_id").distinct()
    reordered = replayed.join(seen_ids, [*STREAM, "message_id"], "left_anti")
    replay_counts = replayed.groupBy(*STREAM).agg(F.count("*").alias("replays"))
    reorder_counts = reordered.groupBy(*STREAM).agg(F.count("*").alias("out_of_order"))
    acks = (
        frames.where((F.col("type") == "ACK") & (F.size("acks") > 0))
        .select(*CONN, "frame_index", F.posexplode("acks").alias("pos", "ack"))
        .select(
            *CONN,
            F.col("ack.stream_id").alias("stream_id"),
            "frame_index",
            "pos",
            F.col("ack.point_of_ref").alias("por"),
        )
        .groupBy(*STREAM)
        .agg(
            F.max_by("por", F.struct("frame_index", "pos")).alias("acked"), F.count("*").alias("checkpoints")
        )
    )
    committed = (
        twopc(frames, internal=True)
        .where(F.col("decision") == True)  # noqa: E712
        .select(*CONN, "phase2_frame", F.explode("where").alias("w"))
        .select(
            *CONN,
            F.col("w.stream_id").alias("stream_id"),
            "phase2_frame",
            F.col("w.end_por").alias("end_por"),
        )
        .groupBy(*STREAM)
        .agg(F.max_by("end_por", "phase2_frame").alias("committed"))
    )
    eos = frames.where(F.col("type") == "EOS_MESSAGE").groupBy(*STREAM).agg(F.count("*").alias("eos"))
    names = (
        frames.where(F.col("type") == "NOTIFY")
        .groupBy(*STREAM)
        .agg(F.max_by("stream_name", "frame_index").alias("stream_name"))
    )
    acked_streams = (
        frames.where(F.col("type") == "ACK")
        .select(*CONN, "use", F.explode("acks").alias("ack"))
        .select(*CONN, F.col("ack.stream_id").alias("stream_id"), "use")
    )
    keys = (
        app.select(*STREAM, "use")
        .unionByName(
            frames.where(F.col("type").isin("NOTIFY", "NOTIFY_ACK", "EOS_MESSAGE")).select(*STREAM, "use")
        )
        .unionByName(acked_streams)
        .distinct()
    )
    zero = F.lit(0).cast("long")
    result = (
        keys.join(names, list(STREAM), "left")
        .join(delivered.drop("use"), list(STREAM), "left")
        .join(gaps, list(STREAM), "left")
        .join(replay_counts, list(STREAM), "left")
        .join(reorder_counts, list(STREAM), "left")
        .join(acks, list(STREAM), "left")
        .join(committed, list(STREAM), "left")
        .join(eos, list(STREAM), "left")
    )
    return result.select(
        *CONN,
        "use",
        "stream_id",
        "stream_name",
        F.coalesce("messages", zero).alias("messages"),
        F.coalesce("bytes", zero).alias("bytes"),
        "first_id",
        "last_id",
        F.coalesce("gaps", zero).alias("gaps"),
        F.coalesce("missing_ids", zero).alias("missing_ids"),
        F.coalesce("replays", zero).alias("replays"),
        F.coalesce("out_of_order", zero).alias("out_of_order"),
        F.coalesce("checkpoints", zero).alias("checkpoints"),
        F.coalesce("acked", "committed").alias("last_checkpoint"),
        F.coalesce("eos", zero).alias("eos"),
    ).orderBy(*STREAM)


def flow_control(frames: DataFrame) -> DataFrame:
    """Credits per connection: granted (OK + ACKs), spent, and time with zero credits.

    Spent follows the dissector: every frame the data side (the connector of a
    source, the worker of a sink) sends after the worker's OK, HELLO aside.
    The credit level after each frame is granted minus the credits the
    protocol core took (none for a frame it rejects), never below zero;
    ``credits_left`` is the last level, and ``zero_credit_s`` adds up the capture time from each frame that
    leaves the level at zero to the next frame of the connection, and
    ``zero_credit_spells`` counts the times it fell to zero. Both are null on a sink's
    connection: the worker ignores a sink's credits and relies on TCP backpressure
    (protocol notes), so its level at zero means nothing, and ``report`` does not draw it.
    """
    F = _f()  # noqa: N806
    data_side = F.when(F.col("use") == "sink", F.lit("worker")).otherwise(F.lit("connector"))
    conn = _window(*CONN)
    ordered = _window(*CONN).orderBy("frame_index")
    ok_at = F.min(
        F.when((F.col("type") == "OK") & (F.col("verdict") == "accepted"), F.col("frame_index"))
    ).over(conn)
    events = (
        frames.where(F.col("frame_index").isNotNull())
        .select(
            *CONN, "use", "sender", "type", "frame_index", "ts_ns", "initial_credits", "credits", "verdict"
        )
        .withColumn("ok_at", ok_at)
        .withColumn(
            "granted",
            F.coalesce(
                F.when(F.col("type") == "OK", F.col("initial_credits")),
                F.when(F.col("type") == "ACK", F.col("credits")),
                F.lit(0),
            ),
        )
        .withColumn(
            "spent",
            F.when(
                (F.col("sender") == data_side)
                & (F.col("type") != "HELLO")
                & F.col("ok_at").isNotNull()
                & (F.col("frame_index") > F.col("ok_at")),
                1,
            ).otherwise(0),
        )
        # The core takes no credit for a frame it rejects, and never goes below zero.
        .withColumn("taken", F.when(F.col("verdict") == "violation", 0).otherwise(F.col("spent")))
        .withColumn("level", F.greatest(F.sum(F.col("granted") - F.col("taken")).over(ordered), F.lit(0)))
        .withColumn("next_ns", F.lead("ts_ns").over(ordered))
        .withColumn("prev_level", F.lag("level").over(ordered))
    )
    at_zero = F.col("ok_at").isNotNull() & (F.col("frame_index") >= F.col("ok_at")) & (F.col("level") <= 0)
    enforced = F.coalesce(F.first("use", ignorenulls=True), F.lit("")) != "sink"
    return (
        events.groupBy(*CONN)
        .agg(
            F.first("use").alias("use"),
            F.sum("granted").alias("credits_granted"),
            F.sum("spent").alias("credits_spent"),
            F.max_by("level", "frame_index").alias("credits_left"),
            F.when(
                enforced,
                F.coalesce(F.sum(F.when(at_zero, F.col("next_ns") - F.col("ts_ns"))) / 1e9, F.lit(0.0)),
            ).alias("zero_credit_s"),
            F.when(
                enforced,
                F.count(F.when(at_zero & ((F.col("prev_level") > 0) | F.col("prev_level").isNull()), 1)),
            ).alias("zero_credit_spells"),
            F.count(F.when(F.col("type") == "ACK", 1)).alias("acks"),
        )
        .orderBy(*CONN)
    )


def twopc(frames: DataFrame, *, internal: bool = False) -> DataFrame:
    """2PC rounds per transaction of each sink connection.

    where (PHASE1 ranges), vote (the sink's REPLY: true = commit), decision (PHASE2),
    phase1_to_reply_s and reply_to_phase2_s (capture time between the frames),
    bytes_committed (sum of end - start over the where-list when the decision is commit).
    A round settled after REPLY_UNCOMMITTED has no PHASE1 and no vote.
    """
    F = _f()  # noqa: N806
    rounds = frames.where(F.col("twopc").isin("PHASE1", "REPLY", "PHASE2"))

    def at(kind: str, column: str):
        return F.min_by(
            F.when(F.col("twopc") == kind, F.col(column)),
            F.when(F.col("twopc") == kind, F.col("frame_index")),
        )

    grouped = rounds.groupBy(*CONN, "txn_id").agg(
        at("PHASE1", "where").alias("where"),
        at("PHASE1", "ts_ns").alias("phase1_ns"),
        at("PHASE1", "packet").alias("phase1_packet"),
        at("REPLY", "commit").alias("vote"),
        at("REPLY", "ts_ns").alias("reply_ns"),
        at("PHASE2", "commit").alias("decision"),
        at("PHASE2", "ts_ns").alias("phase2_ns"),
        at("PHASE2", "packet").alias("phase2_packet"),
        at("PHASE2", "frame_index").alias("phase2_frame"),
        F.min("frame_index").alias("first_frame"),
    )
    span = F.aggregate(
        F.coalesce("where", F.array().cast(f"array<struct<stream_id:{U64},start_por:{U64},end_por:{U64}>>")),
        F.lit(0).cast("long"),
        lambda acc, w: acc + (w["end_por"] - w["start_por"]).cast("long"),
    )
    rounds = grouped.select(
        *CONN,
        "txn_id",
        "where",
        "vote",
        "decision",
        ((F.col("reply_ns") - F.col("phase1_ns")) / 1e9).alias("phase1_to_reply_s"),
        ((F.col("phase2_ns") - F.col("reply_ns")) / 1e9).alias("reply_to_phase2_s"),
        F.when(F.col("decision") == True, span).otherwise(F.lit(0).cast("long")).alias("bytes_committed"),  # noqa: E712
        "phase1_packet",
        "phase2_packet",
        "phase2_frame",
        "first_frame",
    )
    if internal:
        return rounds
    return rounds.orderBy(*CONN, "first_frame").drop("phase2_frame", "first_frame")


def restarts(frames: DataFrame) -> DataFrame:
    """Each RESTART, the reconnect that followed it, and what was replayed on it.

    The reconnect is the first connection of the same capture, opened after the
    RESTART, that NOTIFYs a stream the restarted connection had. Replayed: its
    application messages on those streams whose id is not above the last id
    the restarted connection delivered for the stream (they were resent).
    """
    F = _f()  # noqa: N806
    rs = frames.where(F.col("type") == "RESTART").select(
        F.col("capture"),
        F.col("connection"),
        F.col("conn_index"),
        F.col("ts").alias("restart_ts"),
        F.col("ts_ns").alias("restart_ns"),
        F.col("packet").alias("restart_packet"),
        F.col("sender"),
        F.col("address"),
    )
    delivered = (
        app_messages(frames)
        .where(F.col("verdict") == "accepted")
        .groupBy(*STREAM)
        .agg(F.max("message_id").alias("last_id"))
    )
    notified = frames.where(F.col("type") == "NOTIFY").select(*STREAM).distinct()
    starts = frames.groupBy(*CONN).agg(F.min("ts_ns").alias("start_ns"))
    candidates = (
        rs.join(notified, list(CONN))  # the restarted connection's streams
        .alias("r")
        .join(
            notified.join(starts, list(CONN)).alias("n"),
            (F.col("r.capture") == F.col("n.capture"))
            & (F.col("r.stream_id") == F.col("n.stream_id"))
            & (F.col("n.start_ns") >= F.col("r.restart_ns"))
            & ~(
                (F.col("n.connection") == F.col("r.connection"))
                & (F.col("n.conn_index") == F.col("r.conn_index"))
            ),
        )
        .select(
            *[F.col(f"r.{c}").alias(c) for c in (*CONN, "restart_ts", "restart_ns")],
            F.col("n.connection").alias("reconnect"),
            F.col("n.conn_index").alias("reconnect_index"),
            F.col("n.start_ns").alias("reconnect_ns"),
        )
    )
    first = candidates.groupBy(*CONN, "restart_ns").agg(
        F.min_by(F.struct("reconnect", "reconnect_index", "reconnect_ns"), "reconnect_ns").alias("next")
    )
    next_conn = first.select(
        *CONN,
        "restart_ns",
        F.col("next.reconnect").alias("reconnect"),
        F.col("next.reconnect_index").alias("reconnect_index"),
        F.col("next.reconnect_ns").alias("reconnect_ns"),
    )
    before = rs.join(notified, list(CONN)).join(delivered, list(STREAM))
    replays = (
        next_conn.join(before.select(*CONN, "restart_ns", "stream_id", "last_id"), [*CONN, "restart_ns"])
        .alias("x")
        .join(
            app_messages(frames).alias("m"),
            (F.col("m.capture") == F.col("x.capture"))
            & (F.col("m.connection") == F.col("x.reconnect"))
            & (F.col("m.conn_index") == F.col("x.reconnect_index"))
            & (F.col("m.stream_id") == F.col("x.stream_id"))
            & (F.col("m.message_id") <= F.col("x.last_id")),
        )
        .groupBy(*[F.col(f"x.{c}").alias(c) for c in CONN], F.col("x.restart_ns").alias("restart_ns"))
        .agg(
            F.count("*").alias("replayed"),
            F.min("m.message_id").alias("replayed_first_id"),
            F.max("m.message_id").alias("replayed_last_id"),
            F.sort_array(F.collect_set("m.stream_id")).alias("replayed_streams"),
        )
    )
    return (
        rs.join(next_conn, [*CONN, "restart_ns"], "left")
        .join(replays, [*CONN, "restart_ns"], "left")
        .select(
            *CONN,
            "restart_packet",
            "restart_ts",
            "sender",
            "address",
            "reconnect",
            ((F.col("reconnect_ns") - F.col("restart_ns")) / 1e9).alias("reconnect_after_s"),
            F.coalesce("replayed", F.lit(0).cast("long")).alias("replayed"),
            "replayed_first_id",
            "replayed_last_id",
            "replayed_streams",
        )
        .orderBy("capture", "restart_ts")
    )


#: name -> builder: the reports, in the order they print (``messages`` first).
REPORTS = {
    "messages": messages,
    "audit": audit,
    "flow_control": flow_control,
    "restarts": restarts,
    "twopc": twopc,
}
