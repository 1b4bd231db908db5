"""Reports derived from the ``frames`` DataFrame, all computed by Spark (no collect).

Every report follows the dissector's definitions (``dissect --summary``), so the
two agree on the same capture; what the dissector's summary does not have
(out-of-order ids, zero-credit time, replays after a reconnect, 2PC timings) is
defined in the docstrings here. A connection is identified by
``(capture, connection, conn_index)``; a stream by that and ``stream_id``.
Frames of one connection are ordered by ``frame_index`` (both directions, as
the protocol core saw them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from wallaroo_proto.display_filter import u64_column
from wallaroo_proto.protocols import names, plugins, schema, table_name
from wallaroo_proto.records import COMMON_FIELDS, FRAME_KEY, STRUCTS, protocol_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CONN = ("capture", "connection", "conn_index")
STREAM = (*CONN, "stream_id")
#: Unsigned 64-bit protocol values (ids, points of reference) as the reports see them: exact
#: decimals (``exact``; the tables hold them as a ``long`` of their 64 bits).
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


def violations(frames: DataFrame) -> DataFrame:
    """Every protocol's violations, one row each, with the frame where it happened.

    Common to every protocol, so a query over it misses none; a protocol's own ``<protocol>_violations``
    adds its fields (vbucket, shard, ...).
    """
    F = _f()  # noqa: N806
    return (
        frames.where(F.size("violations") > 0)
        .select(
            "capture",
            "protocol",
            "connection",
            "conn_index",
            "packet",
            "offset",
            "frame_index",
            "sender",
            "type",
            "verdict",
            F.explode("violations").alias("reason"),
        )
        .orderBy("capture", "conn_index", "frame_index")
    )


def findings(frames: DataFrame) -> DataFrame:
    """Every protocol's findings, one row each (``findings.of_record``): a frame's violations are
    errors, its capture notes warnings, and its plug-in's finding has the plug-in's severity."""
    F = _f()  # noqa: N806
    item = "struct<severity:string,finding:string>"
    empty = F.array().cast(f"array<{item}>")

    def each(column: str, severity: str):
        return F.transform(
            F.coalesce(F.col(column), F.array().cast("array<string>")),
            lambda text: F.struct(F.lit(severity).alias("severity"), text.alias("finding")),
        )

    own = F.when(
        F.col("finding").isNotNull(),
        F.array(F.struct(F.col("severity").alias("severity"), F.col("finding").alias("finding"))),
    ).otherwise(empty)
    about = ("capture", "protocol", "connection", "conn_index", "packet", "frame_index", "ts", "type")
    every = F.concat(each("violations", "error"), each("notes", "warning"), own)
    return (
        frames.select(*about, F.posexplode(every).alias("n", "f"))
        .orderBy("capture", "conn_index", "frame_index", "packet", "n")
        .select(*about, F.col("f.severity").alias("severity"), F.col("f.finding").alias("finding"))
    )


def connections(frames: DataFrame) -> DataFrame:
    """Per connection of every protocol: use (a Wallaroo connection's source or sink), frames (decoded
    ones, as the dissector counts them), bytes, violations (rows of ``violations``), span."""
    F = _f()  # noqa: N806
    return (
        frames.groupBy(*CONN)
        .agg(
            F.first("protocol").alias("protocol"),
            F.first("wallaroo.use", ignorenulls=True).alias("use"),
            F.count(F.when(F.col("type") != "INVALID", 1)).alias("frames"),
            F.coalesce(F.sum("length"), F.lit(0)).alias("bytes"),
            F.coalesce(F.sum(F.size(F.coalesce("violations", F.array()))), F.lit(0)).alias("violations"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
        )
        .orderBy(*CONN)
    )


#: name -> builder: Wallaroo's reports (over its own rows, as every protocol's).
REPORTS = {
    "audit": audit,
    "flow_control": flow_control,
    "restarts": restarts,
    "twopc": twopc,
}

#: name -> (title, builder): the views over every protocol's frames, printed first.
COMMON = {
    "connections": ("Connections", connections),
    "violations": ("Protocol violations", violations),
    "findings": ("Findings: violations (error), capture notes (warning), each protocol's events", findings),
}


def view_names() -> list[str]:
    """Every view ``build_tables`` makes (and ``spark-replay`` registers), in its order."""
    names = ["frames", *(protocol_table(plugin.name) for plugin in plugins())]
    for plugin in plugins():
        names += [table_name(plugin.name, name) for name in plugin.spark_reports()]
    return [*names, *COMMON, "problems"]


def printed_views(protocols: Iterable[str]) -> list[tuple[str, str]]:
    """(view, title) of the standard tables, each title ending in its view name: the common views,
    Wallaroo's reports, and another protocol's when ``protocols`` (those in the captures) has it."""
    present = set(protocols)
    shown = [(name, title) for name, (title, _) in COMMON.items()]
    for plugin in plugins():
        if plugin.name == "wallaroo" or plugin.name in present:
            shown += [(table_name(plugin.name, name), title) for name, title in plugin.report_titles.items()]
    return [(name, f"{title} ({name})") for name, title in shown]


def build_tables(everything: DataFrame, problems: DataFrame | None = None) -> dict[str, DataFrame]:
    """Every table spark-replay offers, by view name (``view_names``), from its one read of the
    data source's ``all`` table (the common fields and a struct column per protocol).

    ``frames`` holds the common fields of every frame; ``<protocol>_frames`` the frame key and the
    plug-in's own fields, of its rows (joined to ``frames`` on ``records.FRAME_KEY``). A protocol's
    reports see its rows with the common fields and its own, and are named ``<protocol>_<report>``,
    Wallaroo's by their plain names (``messages``, ``audit``, ...); the common views see every row.
    """
    F = _f()  # noqa: N806
    common = [name for name, _, _ in COMMON_FIELDS]
    tables = {"frames": everything.select(*common)}
    for plugin in plugins():
        rows = everything.where(F.col("protocol") == plugin.name)
        tables[protocol_table(plugin.name)] = rows.select(*FRAME_KEY, f"{plugin.name}.*")
    for plugin in plugins():
        mine = everything.where(F.col("protocol") == plugin.name)
        own = mine.select(
            *common, *(exact(name, F.col(f"{plugin.name}.{name}")) for name in _own(plugin.name))
        )
        for name, build in plugin.spark_reports().items():
            tables[table_name(plugin.name, name)] = build(own)
    for name, (_, build) in COMMON.items():
        tables[name] = build(everything)
    if problems is not None:
        tables["problems"] = problems
    return tables


def field_column(name: str):
    """A record field as a column of the ``all`` table: a common one as it is (``ts`` in seconds, as
    records have it), a plug-in's from the struct of each protocol that declares it."""
    F = _f()  # noqa: N806
    if name == "ts":  # as records have it: ts_ns / 1e9, the same double
        return F.col("ts_ns") / 1e9
    if any(name == common for common, _, _ in COMMON_FIELDS):
        return F.col(name)
    owners = [F.col(f"{p}.{name}") for p in names() if any(name == f for f, _, _ in schema.own_fields(p))]
    if not owners:
        raise KeyError(name)
    return owners[0] if len(owners) == 1 else F.coalesce(*owners)


def flat_columns() -> list:
    """Every field (``protocols.schema.field_names()``) as a column of the ``all`` table, as
    ``dissect --format jsonl`` records hold it: ``ts`` in seconds, u64 values exact (``exact``)."""
    F = _f()  # noqa: N806
    common = {name for name, _, _ in COMMON_FIELDS} - {"ts"}
    return [
        F.col(name) if name in common else exact(name, field_column(name)) for name in schema.field_names()
    ]


def flat_frames(everything: DataFrame) -> DataFrame:
    """The ``all`` table as flat records (``flat_columns``): for ``report``'s ladder, which reads
    any protocol's fields."""
    return everything.select(*flat_columns())


def _own(protocol: str) -> list[str]:
    return [name for name, _, _ in schema.own_fields(protocol)]


def exact(name: str, column):
    """A field's column named ``name``, its u64 values (a ``long`` of their bits in the tables) as
    exact ``decimal(20,0)``: what the reports compute on, so that their ordering, min, max and
    arithmetic hold past 2^63, and what they show."""
    F = _f()  # noqa: N806
    kind = schema.field_types().get(name, "")
    if kind == "u64":
        return u64_column(column).alias(name)
    if kind.startswith("array<struct:"):
        parts = STRUCTS[kind[len("array<struct:") : -1]]
        return F.transform(
            column,
            lambda e: F.struct(*((u64_column(e[p]) if k == "u64" else e[p]).alias(p) for p, k in parts)),
        ).alias(name)
    return column.alias(name)
