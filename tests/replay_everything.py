"""One spark-replay over every protocol's captures, shared by the tests that read its output.

A Spark application costs half a minute or more to start on a loaded machine,
so the per-protocol checks, the u64 check, the report check and the standalone
cluster's comparison all read one run: ``--format jsonl`` rows (with a ``--sql`` query
and the example ``--job``), ``--output`` Parquet tables and a ``--report`` page,
over the sample captures, hand-built Wallaroo captures, a damaged one, and two
Kinesis conversations recorded by mock-daemon. One run over all five protocols
also shows that they do not disturb each other.
"""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass, field
from pathlib import Path

from support import run_cli

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
#: First, so the report numbers their connections c1-1, c2-1, c2-2 and c3-1.
REPORT_SAMPLES = [CAPTURES / n for n in ("sink-2pc.pcap", "restart-reconnect.pcap", "source-session.pcap")]
#: Every protocol's default port, and the ports the DCP samples' producers listened on.
DEFAULT_PORTS = (7100, 7200, 7300, 11210, 2000, 2001, 9899)
SQL = "SELECT type, count(*) AS n FROM frames GROUP BY type"
JOB = "wallaroo_proto.spark.example_job:key_counts"
PREFIX = "wallaroo-proto spark-replay: "


@dataclass
class Replay:
    paths: dict[str, Path]  # name -> capture
    args: list[str]  # spark-replay's arguments before --master and the outputs
    rows: list[dict]
    output: Path  # --output: one Parquet table per directory
    report: Path
    returncode: int
    stderr: str
    tables: dict[str, list[dict]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for row in self.rows:
            self.tables.setdefault(row["table"], []).append(row)

    def save(self, path: Path) -> None:
        fields = {"paths": {k: str(v) for k, v in self.paths.items()}, "args": self.args, "rows": self.rows}
        fields |= {"output": str(self.output), "report": str(self.report)}
        path.write_text(json.dumps(fields | {"returncode": self.returncode, "stderr": self.stderr}))

    @classmethod
    def load(cls, path: Path) -> Replay:
        fields = json.loads(path.read_text())
        fields["paths"] = {k: Path(v) for k, v in fields["paths"].items()}
        return cls(**fields | {"output": Path(fields["output"]), "report": Path(fields["report"])})

    def ok(self) -> Replay:
        """The run, once it is known to have read everything but the damaged capture.

        The damaged capture makes the exit 1 (a problem found); a violation is a finding, not a problem.
        """
        named = [line for line in self.stderr.splitlines() if line.startswith(f"{PREFIX}capture ")]
        assert self.returncode == 1 and named, self.stderr[-3000:]
        assert all(line.startswith(f"{PREFIX}capture {self.paths['damaged']}: ") for line in named), named
        assert "Traceback" not in self.stderr
        return self

    def table(self, name: str, capture: str) -> list[dict]:
        """Rows of one table that came from the capture called ``capture``."""
        return [r for r in self.tables.get(name, []) if r["capture"] == str(self.paths[capture])]


def build_inputs(root: Path) -> tuple[dict[str, Path], list[str]]:
    """Every capture the shared run reads, by name, and the arguments naming them."""
    from test_dcp_dissect import server_port
    from test_kinesis_dissect import record
    from test_spark_datasource import write_big_ids
    from test_spark_replay import write_sink, write_source

    paths = {p.name: p for p in REPORT_SAMPLES}
    paths.update({p.name: p for p in sorted(CAPTURES.glob("*.pcap*")) if p.name not in paths})
    paths["source"], paths["sink"], paths["big"] = root / "source.pcap", root / "sink.pcap", root / "big.pcap"
    write_source(paths["source"])
    write_sink(paths["sink"])
    write_big_ids(paths["big"])
    data = paths["source"].read_bytes()
    paths["damaged"] = root / "damaged.pcap"
    paths["damaged"].write_bytes(data[: len(data) * 3 // 5])  # ends inside a packet record
    paths["kinesis"], paths["kinesis-bad"] = root / "mld.pcap", root / "mld-bad.pcap"
    assert record(paths["kinesis"]).returncode == 0
    record(paths["kinesis-bad"], "--bad-response-after", "10")
    ports = {*DEFAULT_PORTS, *(server_port(CAPTURES / n) for n in ("dcp-stream.pcap", "dcp-rollback.pcap"))}
    args = [str(p) for p in paths.values()] + ["--sql", SQL, "--job", JOB, "--tables"]
    for port in sorted(ports):
        args += ["--port", str(port)]
    return paths, args


def shared_replay(root: Path) -> Replay:
    """The one run for every test process of a test run (pytest-xdist's workers share ``root``):
    the first to come runs it, the others wait for it and read what it saved."""
    root.mkdir(exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = root / "replay.json"
        if saved.exists():
            return Replay.load(saved)
        result = replay(root)
        result.save(saved)
        return result


def replay(root: Path) -> Replay:
    paths, args = build_inputs(root)
    output, report = root / "out", root / "report.html"
    result = run_cli(
        "spark-replay",
        *args,
        *("--master", "local[2]", "--format", "jsonl", "-o", str(output), "--report", str(report)),
        timeout=900,
    )
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return Replay(paths, args, rows, output, report, result.returncode, result.stderr)
