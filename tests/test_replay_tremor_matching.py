"""The replay's matcher on a Tremor node's early answers (sans-IO): an echo that comes before the
replay has reached it in the recording waits for it, rather than being extra."""

from __future__ import annotations

from wallaroo_proto.replay import adapter
from wallaroo_proto.replay.compare import Matcher, Result


def echo(n: int, packet: int) -> dict:
    return {"type": "echo", "alias": "echo", "message_json": f'{{"echo":{n}}}', "packet": packet}


def matcher(hold: int) -> Matcher:
    return Matcher(adapter.noise("tremor"), adapter.key_of("tremor"), hold=hold)


def test_an_answer_seen_before_it_is_expected_is_matched_when_it_is():
    m = matcher(hold=16)
    assert m.seen(echo(0, 30)) is None  # the node answered before the replay sent the rest
    assert m.first_held() == 30
    m.expect(14, echo(0, 14))
    assert m.counts[Result.MATCHED] == 1 and m.counts[Result.EXTRA] == 0
    assert m.first_held() is None


def test_an_early_answer_that_differs_is_divergent_at_its_recorded_frame():
    m = matcher(hold=16)
    m.seen(echo(1, 30))
    m.expect(14, echo(0, 14))
    (outcome,) = m.kept
    assert outcome.result is Result.DIVERGENT and outcome.recorded["packet"] == 14
    assert outcome.live["packet"] == 30 and [f for f, _, _ in outcome.fields] == ["message_json"]


def test_what_is_never_expected_is_extra_at_the_end_or_once_too_many_wait():
    m = matcher(hold=2)
    for packet in (30, 31, 32):
        m.seen(echo(packet, packet))
    assert [o.live["packet"] for o in m.kept] == [30]  # the oldest, past the bound
    m.give_up_all("the replay ended")
    assert [o.result for o in m.kept] == [Result.EXTRA] * 3 and m.first_held() is None
