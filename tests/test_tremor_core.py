"""Tremor: one session's rules, judged from both sides; the node's answers; the pub/sub broker."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.judge import End, Kind, Verdict
from wallaroo_proto.protocols.tremor.core import CLIENT, RULES, SERVER, Session
from wallaroo_proto.protocols.tremor.node import Broker, NodeSession

CONNECT_ECHO = '{"tremor":{"connect":{"protocol":"echo"}}}'
ACK_ECHO = '{"tremor":{"connect-ack":{"protocol":"echo","alias":"echo"}}}'


def test_rfc_echo_walkthrough_with_the_prototypes_ack():
    s = Session()
    assert s.feed(SERVER, '{"tremor":{"version":"0.10.2"}}').ok  # the prototype's greeting
    v = s.feed(CLIENT, CONNECT_ECHO)
    assert v.ok and v.type == "connect" and s.state == "active"
    assert s.feed(SERVER, ACK_ECHO).ok
    assert s.feed(CLIENT, '{"echo":"beep"}').type == "echo"
    assert s.feed(SERVER, '{"echo":"beep"}').ok
    assert s.feed(CLIENT, '{"tremor":{"disconnect":"echo"}}').ok
    assert s.feed(SERVER, '{"tremor":{"disconnect-ack":{"alias":"echo"}}}').ok
    assert s.state == "idle"  # RFC: Active -> Idle on the last disconnect
    assert s.feed(CLIENT, '{"tremor":"close"}').ok and s.state == "closing"
    assert s.feed(SERVER, '{"tremor":{"close-ack":"ok"}}').ok and s.state == "closed"
    assert s.violations == 0 and s.owed() == 0


@pytest.mark.parametrize(
    ("messages", "code"),
    [
        (['{"badger":"badger"}'], "0.207"),
        ([CONNECT_ECHO, CONNECT_ECHO], "0.206"),
        (['{"tremor":{"connect":{"protocol":"tremor"}}}'], "0.206"),
        (['{"tremor":{"connect":{"protocol":"kafka"}}}'], "0.200"),
        (['{"tremor":{"disconnect":{"alias":"nope"}}}'], "0.207"),
        (['{"tremor":{"connect-ack":{"protocol":"echo","alias":"x"}}}'], "0.202"),
        (['{"tremor":"close"}', CONNECT_ECHO], "0.202"),
        (
            [
                '{"tremor":{"connect":{"protocol":"pubsub","alias":"p"}}}',
                '{"p":{"unsubscribe":["/pipeline/a/out"]}}',
            ],
            "2.201",
        ),
        (
            ['{"tremor":{"connect":{"protocol":"pubsub","alias":"p"}}}', '{"p":{"subscribe":["not a url"]}}'],
            "2.200",
        ),
        (
            [
                '{"tremor":{"connect":{"protocol":"pubsub","alias":"p"}}}',
                '{"p":{"send":{"to":"/pipeline/a/in","data":1}}}',
            ],
            "2.202",
        ),
        (['{"tremor":{"connect":{"protocol":"pubsub","alias":"p"}}}', '{"p":{"frob":[]}}'], "0.202"),
        (['{"tremor":{"connect":{"protocol":"pubsub","alias":"p"}}}', '{"p":42}'], "0.203"),
        (['"snot"'], "0.203"),  # a bare string is a value like any other: not a record
        (['""'], "0.203"),
        (['"{\\"echo\\":1}"'], "0.203"),  # a string holding JSON text is still a string
        (["42"], "0.203"),
        ([CONNECT_ECHO, '{"echo":NaN}'], "0.101"),
    ],
)
def test_client_violations_and_their_codes(messages, code):
    s = Session()
    verdicts = [s.feed(CLIENT, text) for text in messages]
    assert all(v.ok for v in verdicts[:-1])
    assert not verdicts[-1].ok and verdicts[-1].code == code and verdicts[-1].reason


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        ('{"echo":"boop"}', 'echo reply "boop" where "beep" was due'),
        ('{"tremor":{"close-ack":"ok"}}', "close-ack where echo was due"),
        ('{"other":1}', "message on 'other', which is not connected"),
        ('{"tremor":{"connect":{"protocol":"echo"}}}', "connect is the client's to send"),
        ("[1,2]", "server sent a malformed message: a message must be a record, not list"),
    ],
)
def test_server_violations(server, reason):
    s = Session()
    s.feed(CLIENT, CONNECT_ECHO)
    s.feed(SERVER, ACK_ECHO)
    s.feed(CLIENT, '{"echo":"beep"}')
    v = s.feed(SERVER, server)
    if "close-ack" in server:  # no close was asked for
        assert v.reason == "close-ack that answers nothing"
    else:
        assert v.reason == reason


def test_version_info_only_first_or_when_asked():
    s = Session()
    s.feed(CLIENT, CONNECT_ECHO)
    s.feed(SERVER, ACK_ECHO)
    assert not s.feed(SERVER, '{"tremor":{"version":"1"}}').ok
    s.feed(CLIENT, '{"tremor":"version"}')
    assert s.feed(SERVER, '{"tremor":{"version":"1"}}').ok


def test_non_strict_pubsub_acks_only_what_succeeds():
    s = Session()
    s.feed(
        CLIENT,
        '{"tremor":{"connect":{"protocol":"pubsub","alias":"p","headers":{"command.policy":"non-strict"}}}}',
    )
    s.feed(SERVER, '{"tremor":{"connect-ack":{"protocol":"pubsub","alias":"p"}}}')
    v = s.feed(CLIENT, '{"p":{"subscribe":["/pipeline/a/out","bad url"]}}')
    assert v.ok and v.answers == ({"p": {"subscribe-ack": ["/pipeline/a/out"]}},)
    assert not s.feed(SERVER, '{"p":{"subscribe-ack":["/pipeline/a/out","bad url"]}}').ok


def _node(broker, ident):
    n = NodeSession(broker, ident)
    n.opened()
    return n


def test_node_answers_and_broker_delivers_across_sessions():
    broker = Broker()
    a, b = _node(broker, 1), _node(broker, 2)
    out = a.receive(
        '{"tremor":{"connect":{"protocol":"pubsub","alias":"in","properties":{"subscriptions":["/pipeline/x/out"]}}}}'
    )
    assert out.replies == ['{"tremor":{"connect-ack":{"protocol":"pubsub","alias":"in"}}}']
    b.receive('{"tremor":{"connect":{"protocol":"pubsub","alias":"out"}}}')
    assert b.receive('{"out":{"publish":["/pipeline/x/out"]}}').replies == [
        '{"out":{"publish-ack":["/pipeline/x/out"]}}'
    ]
    out = b.receive('{"out":{"send":{"to":"/pipeline/x/out","data":{"n":1}}}}')
    assert out.replies == []
    assert [(t.ident, text) for t, text in out.deliveries] == [
        (1, '{"in":{"data":{"n":1},"meta":{"url":"tremor://localhost/pipeline/x/out"}}}')
    ]
    a.receive('{"in":{"unsubscribe":["/pipeline/x/out"]}}')
    assert b.receive('{"out":{"send":{"to":"/pipeline/x/out","data":2}}}').deliveries == []


def test_node_closes_a_broken_session_with_the_prototypes_text():
    n = _node(Broker(), 1)
    out = n.receive('{"fleek":1,"flook":2}')
    assert out.replies == [
        '{"tremor":{"close":"0.205: Protocol operation - record requires one field only"}}'
    ]
    assert out.close and out.violation
    out = _node(Broker(), 2).receive('{"tremor":"close"}')
    assert out.replies == ['{"tremor":{"close-ack":"ok"}}'] and out.close


_ALIASES = st.sampled_from(["echo", "e2", "ps", "nope", "tremor"])
_URLS = st.sampled_from(["/pipeline/a/out", "/onramp/m/in", "tremor://h/pipeline/a/out", "bad"])
_CLIENT_VALUES = st.one_of(
    st.builds(
        lambda p, a: {"tremor": {"connect": {"protocol": p, "alias": a}}},
        st.sampled_from(["echo", "pubsub", "api", "kafka"]),
        _ALIASES,
    ),
    st.builds(lambda a: {"tremor": {"disconnect": a}}, _ALIASES),
    st.builds(lambda a: {"tremor": {"disconnect": {"alias": a}}}, _ALIASES),
    st.just({"tremor": "version"}),
    st.just({"tremor": "close"}),
    st.builds(lambda a, v: {a: v}, _ALIASES, st.integers() | st.text(max_size=5)),
    st.builds(
        lambda a, op, urls: {a: {op: urls}},
        _ALIASES,
        st.sampled_from(["subscribe", "unsubscribe", "publish", "unpublish"]),
        st.lists(_URLS, max_size=3),
    ),
    st.builds(lambda a, to: {a: {"send": {"to": to, "data": 1}}}, _ALIASES, _URLS),
    st.builds(lambda a, w: {a: w}, _ALIASES, st.sampled_from(["list", "version"])),
    st.just({"a": 1, "b": 2}),
    st.just([1]),
)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_CLIENT_VALUES, max_size=25))
def test_whatever_a_client_sends_the_node_answers_what_a_client_judge_accepts(values):
    """The node's replies and pushes pass a separate client-side judge; a refusal ends the session."""
    broker = Broker()
    node = NodeSession(broker, 1)
    judge = Session()
    for text in node.opened():
        assert judge.feed(SERVER, text).ok
    for value in values:
        judge.feed(CLIENT, value)
        out = node.receive(json.dumps(value))
        replies = out.replies + [t for target, t in out.deliveries if target is node]
        for text in replies:
            verdict = judge.feed(SERVER, text)
            assert verdict.ok, (value, text, verdict.reason)
        if out.close:
            assert judge.state == "closed"
            break
    assert judge.owed() == 0  # every message had its answers, in order


def test_pipelined_pubsub_requests_and_an_event_crossing_an_unsubscribe():
    s = Session()
    s.feed(CLIENT, '{"tremor":{"connect":{"protocol":"pubsub","alias":"p"}}}')
    assert s.feed(CLIENT, '{"p":{"subscribe":["/pipeline/a/out"]}}').ok
    assert s.feed(CLIENT, '{"p":{"unsubscribe":["/pipeline/a/out"]}}').ok  # before the subscribe-ack came
    assert s.feed(SERVER, '{"tremor":{"connect-ack":{"protocol":"pubsub","alias":"p"}}}').ok
    assert s.feed(SERVER, '{"p":{"subscribe-ack":["/pipeline/a/out"]}}').ok
    assert s.feed(SERVER, '{"p":{"data":1,"meta":{}}}').ok  # sent before the node saw the unsubscribe
    assert s.feed(SERVER, '{"p":{"unsubscribe-ack":["/pipeline/a/out"]}}').ok
    fresh = Session()
    fresh.feed(CLIENT, '{"tremor":{"connect":{"protocol":"pubsub","alias":"q"}}}')
    assert fresh.feed(SERVER, '{"q":{"data":1}}').reason == "pubsub data on a stream that never subscribed"


@pytest.mark.parametrize(
    "text",
    [
        '{"e":NaN}',  # Python's json would take it and write back a NaN no JSON reader takes
        '{"e":"\\ud800"}',  # a lone surrogate: taken, then unencodable as UTF-8 on the way out
        "[" * 100_000 + "]" * 100_000,  # deeper than Python's recursion
    ],
)
def test_node_closes_values_it_could_not_send_back_with_0_101(text):
    n = _node(Broker(), 1)
    n.receive('{"tremor":{"connect":{"protocol":"echo","alias":"e"}}}')
    out = n.receive(text)
    assert out.replies == ['{"tremor":{"close":"0.101: Malformed value - not a well-formed tremor value"}}']
    assert out.close and out.violation and out.internal is None


def test_node_survives_its_own_failure_with_the_prototypes_internal_error_close(monkeypatch):
    n = _node(Broker(), 1)

    def broken(_text):
        raise RuntimeError("boom")

    monkeypatch.setattr(n, "_receive", broken)
    out = n.receive('{"tremor":"version"}')
    assert out.replies == ['{"tremor":{"close":"unknown server error"}}']
    assert out.close and out.internal == "RuntimeError: boom"


_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=10,
)
_NASTY = st.sampled_from(
    ["NaN", "-Infinity", "Infinity", '"\\ud800"', '"\\udc00x"', "1e999", "-1e999", "[" * 600 + "]" * 600]
)


def _message_text(draw_alias, value, nasty, where):
    text = json.dumps({draw_alias: value})
    if nasty is not None:  # put a value no JSON writer could produce somewhere inside
        text = text[:where] + nasty + text[where:] if where < len(text) else text + nasty
    return text


_TEXTS = st.one_of(
    st.text(max_size=40),  # anything at all
    st.builds(
        _message_text,
        st.sampled_from(["e", "ps", "tremor", "nope"]),
        _JSONISH,
        st.none() | _NASTY,
        st.integers(0, 60),
    ),
    st.builds(
        lambda a, v, n: json.dumps({a: v}).replace("0", n, 1),
        st.sampled_from(["e", "ps"]),
        _JSONISH,
        _NASTY,
    ),
    st.sampled_from(
        [
            '{"tremor":{"connect":{"protocol":"echo","alias":"e"}}}',
            '{"tremor":{"connect":{"protocol":"pubsub","alias":"ps",'
            '"properties":{"subscriptions":["/pipeline/a/out"],"publications":["/pipeline/a/out"]}}}}',
            '{"ps":{"send":{"to":"/pipeline/a/out","data":0}}}',
        ]
    ),
)


@settings(max_examples=400, deadline=None)
@given(texts=st.lists(_TEXTS, max_size=12))
def test_whatever_text_a_client_sends_the_node_answers_validly_or_closes_with_a_status(texts):
    """Any text message gets replies a separate judge accepts, each encodable as UTF-8, or the
    protocol's error close with a status code; never the node's own failure."""
    node = NodeSession(Broker(), 1)
    judge = Session()
    for text in node.opened():
        assert judge.feed(SERVER, text).ok
    for text in texts:
        judge.feed(CLIENT, text)
        out = node.receive(text)
        assert out.internal is None, (text, out.internal)
        replies = out.replies + [t for target, t in out.deliveries if target is node]
        for reply in replies:
            reply.encode("utf-8")
            verdict = judge.feed(SERVER, reply)
            assert verdict.ok, (text, reply, verdict.reason)
        if out.close:
            assert judge.state == "closed"
            if out.violation is not None:
                assert judge.error_close is not None and judge.error_close[:1].isdigit()
            break
    assert judge.owed() == 0


# ----------------------------------------------------------------------------- the judge contract

_SERVER_VALUES = st.one_of(
    _CLIENT_VALUES,
    st.builds(
        lambda p, a: {"tremor": {"connect-ack": {"protocol": p, "alias": a}}}, st.just("echo"), _ALIASES
    ),
    st.builds(lambda a: {"tremor": {"disconnect-ack": {"alias": a}}}, _ALIASES),
    st.sampled_from(
        [{"tremor": {"close-ack": "ok"}}, {"tremor": {"version": "1"}}, {"tremor": {"close": "x"}}]
    ),
    st.builds(lambda a, r: {a: r}, _ALIASES, st.sampled_from([{"data": 1}, {"list": {}}, {"x": 1}, 1])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(Session.SIDES), _SERVER_VALUES | _TEXTS), max_size=25))
def test_every_verdict_is_the_judges_and_every_violation_names_a_rule(messages):
    s = Session()
    for side, value in messages:
        verdict = s.feed(side, value)
        assert isinstance(verdict, Verdict) and verdict.side == side
        if verdict.kind is Kind.VIOLATION:
            assert verdict.rule in RULES and verdict.reason
        else:
            assert verdict.rule is None
        expected = s.expects()
        assert set(expected.legal) == {CLIENT, SERVER} and expected.text


def test_expects_names_the_types_records_give():
    s = Session()
    assert s.expects().legal == {
        CLIENT: {"connect", "version", "close"},
        SERVER: {"version-info", "error-close"},
    }
    s.feed(CLIENT, CONNECT_ECHO)
    assert s.expects() == (
        {
            CLIENT: {"connect", "version", "close", "disconnect", "echo"},
            SERVER: {"connect-ack", "version-info", "error-close"},
        },
        "the server's connect-ack",
    )
    s.feed(SERVER, ACK_ECHO)
    s.feed(CLIENT, '{"echo":"beep"}')
    assert s.expects().legal[SERVER] == {"echo", "error-close"}
    s.feed(CLIENT, '{"tremor":"close"}')
    assert s.expects().legal[CLIENT] == set()


def test_a_cut_side_leaves_answers_unjudged():
    s = Session()
    s.feed(CLIENT, CONNECT_ECHO)
    assert s.end(SERVER, End.CLOSED) is None and s.end(SERVER, End.RESET) is None
    assert not s.feed(SERVER, '{"echo":1}').ok  # nothing asked for it
    assert s.end(CLIENT, End.CUT, 3) is None  # what the client asked is no longer known
    assert s.feed(SERVER, '{"echo":1}').ok


def test_lost_bytes_leave_answers_unjudged_and_both_sides_going_on():
    """A capture's gap is no end: the session goes on, judging what it still can."""
    s = Session()
    s.feed(CLIENT, CONNECT_ECHO)
    assert not s.feed(SERVER, '{"echo":1}').ok  # nothing asked for it
    s.lost()
    assert s.feed(SERVER, '{"echo":1}').ok
    assert s.expects().legal[CLIENT], "the client may still send"


def test_a_version_request_that_crossed_the_greeting_is_answered_after_it():
    """The node greets as the WebSocket opens; a client that asks for the version at once has its
    request cross the greeting on the wire: the greeting is the first, the answer the second."""
    s = Session()
    assert s.feed(CLIENT, '{"tremor":"version"}').ok
    assert s.feed(SERVER, '{"tremor":{"version":"0.10.2"}}').ok
    assert s.feed(SERVER, '{"tremor":{"version":"0.10.2"}}').ok
    assert s.owed() == 0


def test_a_client_message_after_the_node_s_error_close_is_ignored_not_a_violation():
    """It may have crossed the error close on the wire (fuzz found the race): read, not acted on.
    After the session closed by the client's own close and its ack, one is still a violation."""
    s = Session()
    assert s.feed(SERVER, '{"tremor":{"version":"0.10.2"}}').ok
    assert s.feed(SERVER, '{"tremor":{"close":"0.207: fuzz"}}').ok and s.state == "closed"
    crossed = s.feed(CLIENT, CONNECT_ECHO)
    assert crossed.kind is Kind.IGNORED and crossed.ok and s.violations == 0
    t = Session()
    assert t.feed(CLIENT, '{"tremor":"close"}').ok
    assert t.feed(SERVER, '{"tremor":{"close-ack":"ok"}}').ok and t.state == "closed"
    assert t.feed(CLIENT, CONNECT_ECHO).kind is Kind.VIOLATION
