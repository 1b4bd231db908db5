"""Issue 38's "one of each": one TOML rule reader, one write watchdog, one --input grammar.

The messages a user sees from the readers are pinned word for word (they held before the
readers became one), and the source is checked for a second copy creeping back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import run_cli

import wallaroo_proto
from wallaroo_proto.input_spec import generated_lines, read_input
from wallaroo_proto.protocols.wallaroo.faults import FaultFileError, load_faults
from wallaroo_proto.protocols.wallaroo.sink_driver import input_name, input_payloads
from wallaroo_proto.proxy import faults as proxy_faults
from wallaroo_proto.proxy.faultkit import FaultError

SOURCE = Path(wallaroo_proto.__file__).parent


def _modules_matching(pattern: str) -> list[str]:
    found = re.compile(pattern, re.MULTILINE)
    return sorted(
        str(p.relative_to(SOURCE))
        for p in SOURCE.rglob("*.py")
        if found.search(p.read_text(encoding="utf-8"))
    )


def test_one_module_reads_toml() -> None:
    assert _modules_matching(r"^\s*import tomllib") == ["rules_file.py"]


# --- the mock sink's fault files -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("f.toml", None, "{p}: cannot read fault file: [Errno 2] No such file or directory: '{p}'"),
        (
            "f.toml",
            b"\xff[[close]]\n",
            "{p}: cannot read fault file: 'utf-8' codec can't decode byte 0xff in position 0: "
            "invalid start byte",
        ),
        (
            "f.toml",
            b'[[close]]\nat = "after_phase1_reply"\ncount = \n',
            "{p}: not valid TOML: Invalid value (at line 3, column 9)",
        ),
        (
            "f.json",
            b"{,}",
            "{p}: not valid JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
        # The message's format is chosen case-sensitively, the parser not: kept as it was.
        (
            "f.JSON",
            b"{,}",
            "{p}: not valid TOML: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
        ("f.toml", b"[[clos]]\n", "{p}: unknown key 'clos'; expected one of abort_vote, close, exit, delay"),
    ],
)
def test_fault_file_errors_word_for_word(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(FaultFileError) as caught:
        load_faults(path)
    assert str(caught.value) == message.format(p=path)


def test_fault_file_lone_cr_is_a_line_end_as_it_always_was(tmp_path: Path) -> None:
    path = tmp_path / "f.toml"
    path.write_bytes(b'[[delay]]\rreply = "phase1"\rms = 5\r')
    assert load_faults(path).delay_ms("phase1") == 5


# --- the proxy's rules files -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "{p}: No such file or directory"),
        (b"\xff\xfe[[fault]]\n", "{p}: not UTF-8 text (byte 0): a rules file is TOML"),
        (b'[[fault]]\naction = "drop"\ntype = \n', "{p}: Invalid value (at line 3, column 8)"),
        (
            b'[[fault]]\raction = "drop"\r',
            "{p}: Expected newline or end of document after a statement (at line 1, column 10)",
        ),
        (b'[[faults]]\naction = "drop"\n', "{p}: unknown table(s) faults: rules are [[fault]] tables"),
        (b"fault = 1\n", "{p}: 'fault' must be an array of tables ([[fault]])"),
        (b"fault = [1]\n", "{p}: fault #1 is not a table"),
    ],
)
def test_rules_file_errors_word_for_word(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "rules.toml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(FaultError) as caught:
        proxy_faults.parse_rules(files=[str(path)])
    assert str(caught.value) == message.format(p=path)


def test_rule_option_values_read_as_toml() -> None:
    assert proxy_faults.parse_option("drop count=1 where='stream_id == 3' type=A,B reset=true x=[1") == {
        "action": "drop",
        "count": 1,
        "where": "stream_id == 3",
        "type": ["A", "B"],
        "reset": True,
        "x": "[1",
    }


def test_one_write_watchdog() -> None:
    """A never-reading peer is found by asking the kernel (SIOCOUTQ) in one place."""
    assert _modules_matching(r"TIOCOUTQ|SIOCOUTQ|SO_LINGER") == ["write_watch.py"]


# --- one --input grammar ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("kinesis", "mock-daemon", "--input", "{p}", "--", "true"),
        ("dcp", "mock-producer", "--listen", "127.0.0.1:0", "--input", "{p}"),
        ("ambrosia", "mock-ic", "--input", "{p}"),
        ("mock-worker", "--sink-connect", "127.0.0.1:9", "--input", "{p}"),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_every_input_option_says_a_missing_file_alike(tmp_path: Path, command: tuple[str, ...]) -> None:
    missing = tmp_path / "missing.txt"
    done = run_cli(*(word.format(p=missing) for word in command))
    assert done.returncode == 2
    name = " ".join(command[:2]) if command[0] in ("kinesis", "dcp", "ambrosia") else command[0]
    assert done.stderr.splitlines() == [
        f"wallaroo-proto {name}: cannot read --input {missing}: No such file or directory"
    ]


def test_the_input_grammar(tmp_path: Path) -> None:
    assert [generated_lines(s) for s in ("gen:5", "generate:7", "-", "gen.txt")] == [5, 7, None, None]
    with pytest.raises(ValueError, match=r"^--input 'gen:x': gen: takes a number of lines, e.g. gen:1000$"):
        generated_lines("gen:x")
    assert [input_name(s) for s in ("gen:5", "generate:5", "-")] == ["gen:5", "gen:5", "-"]
    assert input_name("in.txt") == str(Path("in.txt").absolute())
    lines = tmp_path / "in.txt"
    lines.write_bytes(b"a\nb\n")
    assert read_input(str(lines)) == b"a\nb\n"
    assert list(input_payloads(str(lines), start=2)) == [b"b\n"]
    assert list(input_payloads("gen:3", payload_size=3, start=3)) == [b"01\n", b"02\n"]


# --- one word per concept --------------------------------------------------------------------


def test_iter_records_means_the_dissectors_record_dicts_alone() -> None:
    """The mock source's length-prefixed input and the sink's transaction log have their own names."""
    assert _modules_matching(r"^def iter_records\(") == ["capture/dissector.py"]
