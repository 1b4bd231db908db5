"""The mock daemon's session over a scripted channel: races a real process makes rare, made certain."""

import asyncio

import pytest

from wallaroo_proto.protocols.kinesis.codec import Initialize
from wallaroo_proto.protocols.kinesis.daemon import Channel, DaemonConfig, MockDaemon, Session, ShardFailure
from wallaroo_proto.protocols.kinesis.leases import LeaseTable
from wallaroo_proto.protocols.kinesis.records import ShardRecords


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
