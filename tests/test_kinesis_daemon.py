"""The mock daemon's session over a scripted channel: races a real process makes rare, made certain."""

import asyncio

import pytest

from wallaroo_proto.protocols.kinesis.codec import Initialize
from wallaroo_proto.protocols.kinesis.daemon import (
    Channel,
    DaemonConfig,
    Faults,
    MockDaemon,
    Session,
    ShardFailure,
)
from wallaroo_proto.protocols.kinesis.leases import LeaseTable
from wallaroo_proto.protocols.kinesis.records import ShardRecords, check_key_template


class GoneProcessor(Channel):
    """A processor that wrote ``output`` and exited before the daemon's first write."""

    def __init__(self, output: list[bytes]) -> None:
        self.output = list(output)

    async def write(self, data: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    async def read(self) -> bytes:
        return self.output.pop(0) if self.output else b""

    async def kill(self) -> None:
        pass


def initialize_against(output: list[bytes]) -> str:
    shard = ShardRecords(0, generated=3)
    daemon = MockDaemon(DaemonConfig(exit_grace=5), [shard], LeaseTable(), log=lambda line: None)
    session = Session(daemon, shard, daemon.stats[shard.shard_id], GoneProcessor(output))
    with pytest.raises(ShardFailure) as failure:
        asyncio.run(session.request(Initialize(shard.shard_id, "TRIM_HORIZON", 0)))
    return str(failure.value)


def test_a_processor_gone_before_the_first_write_is_judged_by_what_it_wrote():
    assert initialize_against([b"{not json\n"]) == (
        "the processor closed its output before its status for initialize (after line 1)"
    )


def test_a_bad_line_before_the_first_write_is_the_failure():
    reason = initialize_against([b'{"action":"status","responseFor":"processRecords"}\n'])
    assert reason.startswith("line 1 of the processor's output:") and "'initialize'" in reason


def test_a_processor_that_wrote_its_status_still_fails_on_the_lost_request():
    reason = initialize_against([b'{"action":"status","responseFor":"initialize"}\n'])
    assert reason.startswith("cannot write initialize to the processor: Broken pipe")


def test_input_records_arrive_one_by_one_and_the_lag_falls_as_they_are_read():
    from wallaroo_proto.protocols.kinesis.records import from_lines

    (shard,) = from_lines([b"a", b"b", b"c", b"d"], 1, now_ms=1000)
    assert [r.approximate_arrival_timestamp for r in shard.slice(0, 4)] == [997, 998, 999, 1000]
    assert [shard.request(i, i + 1)[0].millis_behind_latest for i in range(4)] == [3, 2, 1, 0]


def daemon_on(shards: list[ShardRecords], leases: LeaseTable, **faults: int) -> MockDaemon:
    config = DaemonConfig(faults=Faults(**faults))
    return MockDaemon(config, shards, leases, log=lambda line: None)


def test_a_shard_resumes_after_its_leases_checkpoint_and_one_without_a_lease_from_the_start():
    first, second = ShardRecords(0, generated=30), ShardRecords(1, generated=30)
    leases = LeaseTable()
    leases.set(first.shard_id, first.record(19).sequence_number, 0)  # records 0..19 are in
    daemon = daemon_on([first, second], leases)
    assert daemon.resumed() == [(first, 20), (second, 0)]
    leases.set(second.shard_id, "SHARD_END", 0)
    assert daemon.resumed() == [(first, 20), (second, 30)]


@pytest.mark.parametrize("fault", ["kill_after", "lease_lost_after", "shutdown_requested_after"])
def test_a_fault_counted_past_the_records_a_shard_has_left_cannot_fire(fault):
    shards = [ShardRecords(0, generated=30), ShardRecords(1, generated=10)]
    option = "--" + fault.replace("_", "-")
    assert daemon_on(shards, LeaseTable(), **{fault: 30}).fault_reach() is None
    assert daemon_on(shards, LeaseTable(), **{fault: 31}).fault_reach() == (
        f"{option} 31 cannot fire: the most records a shard gets in this run is 30"
    )


def test_what_a_lease_table_holds_is_not_delivered_again_so_a_fault_past_the_rest_cannot_fire(tmp_path):
    shard = ShardRecords(0, generated=1000)
    leases = LeaseTable(tmp_path / "leases.json")
    leases.set(shard.shard_id, shard.record(989).sequence_number, 0)
    assert daemon_on([shard], leases, kill_after=10).fault_reach() is None
    assert daemon_on([shard], leases, kill_after=11).fault_reach() == (
        "--kill-after 11 cannot fire: the most records a shard gets in this run is 10 "
        "(what --state holds as checkpointed is skipped)"
    )
    assert daemon_on([], leases, lease_lost_after=1).fault_reach() == (
        "--lease-lost-after 1 cannot fire: the most records a shard gets in this run is 0 "
        "(what --state holds as checkpointed is skipped)"
    )


def test_after_a_kill_records_are_delivered_again_so_only_the_kill_is_held_to_the_records_left():
    shards = [ShardRecords(0, generated=10)]
    assert daemon_on(shards, LeaseTable(), kill_after=5, lease_lost_after=15).fault_reach() is None
    assert daemon_on(shards, LeaseTable(), kill_after=5, shutdown_requested_after=15).fault_reach() is None


@pytest.mark.parametrize("template", ["{n}", "pk-{line}", "{line}/{n:03d}", "fixed"])
def test_a_key_template_naming_n_and_line_only_is_taken(template):
    check_key_template(template)


@pytest.mark.parametrize(
    ("template", "why"),
    [("{shard}", "'shard'"), ("{0}", "Replacement index 0 out of range"), ("{n", "expected '}'")],
)
def test_a_key_template_that_would_fail_on_every_line_is_refused_before_any_is_read(template, why):
    with pytest.raises(ValueError) as refused:
        check_key_template(template)
    assert str(refused.value).startswith(f"{template!r}: use {{n}} and {{line}} only (")
    assert why in str(refused.value)
