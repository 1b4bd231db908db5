"""Every protocol's core keeps the one judge contract (``wallaroo_proto.judge``): the same verbs,
one ``Verdict`` type, its sides and its rules named as data."""

from __future__ import annotations

from pathlib import Path

import pytest

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.judge import End, Expected, Kind, Verdict
from wallaroo_proto.protocols import get_plugin, names


@pytest.mark.parametrize("name", names())
def test_the_core_names_its_sides_and_its_rules(name: str) -> None:
    core = get_plugin(name).judge
    assert len(core.SIDES) == 2 and all(type(side) is str and side for side in core.SIDES)
    assert core.RULES, "a catalogue of rules"
    for rule, says in core.RULES.items():
        assert rule == rule.lower() and " " not in rule, f"a rule's name is one lower-case word: {rule!r}"
        assert says and says[0].islower() and not says.endswith("."), f"{rule}: {says!r}"


@pytest.mark.parametrize("name", names())
def test_a_fresh_judge_says_what_it_expects_of_each_side(name: str) -> None:
    core = get_plugin(name).judge
    judge = core()
    expected = judge.expects()
    assert type(expected) is Expected
    assert set(expected.legal) == set(core.SIDES)
    assert any(expected.legal.values()), "a fresh conversation waits for some first frame"
    assert expected.text


@pytest.mark.parametrize("name", names())
def test_the_verbs_are_the_contracts(name: str) -> None:
    core = get_plugin(name).judge
    for verb in ("feed", "end", "expects"):
        assert callable(getattr(core, verb, None)), verb
    for how in End:
        ended = core().end(core.SIDES[0], how, partial=3 if how is End.CUT else 0)
        assert ended is None or isinstance(ended, Verdict), how
        if ended is not None and ended.kind is Kind.VIOLATION:
            assert ended.rule in core.RULES, (how, ended)


@pytest.mark.parametrize("name", names())
def test_a_side_none_of_its_sides_is_refused(name: str) -> None:
    """A driver's slip (a side misnamed) is told, never judged as the other side."""
    core = get_plugin(name).judge
    with pytest.raises(ValueError, match="nobody"):
        core().feed("nobody", None)
    with pytest.raises(ValueError, match="nobody"):
        core().end("nobody")


SAMPLES = sorted((Path(__file__).resolve().parent.parent / "captures").glob("*.pcap*"))


@pytest.mark.parametrize("name", names())
def test_every_verdict_on_the_sample_captures_keeps_the_contract(name: str, monkeypatch) -> None:
    """What the dissector gets from each core on real conversations: judge verdicts, each from one
    of the core's sides, each violation naming a rule of its catalogue."""
    core = get_plugin(name).judge
    given = core.feed
    verdicts: list[Verdict] = []

    def feed(self, side, frame, *args, **kwargs):
        verdict = given(self, side, frame, *args, **kwargs)
        verdicts.append(verdict)
        return verdict

    monkeypatch.setattr(core, "feed", feed)
    for capture in SAMPLES:
        for _ in Dissector(capture.name).run(capture):
            pass
    assert verdicts, f"the sample captures hold {name} frames the core judged one by one"
    for verdict in verdicts:
        assert isinstance(verdict, Verdict)
        assert verdict.side in core.SIDES, verdict
        assert (verdict.rule in core.RULES) if verdict.kind is Kind.VIOLATION else verdict.rule is None, (
            verdict
        )
