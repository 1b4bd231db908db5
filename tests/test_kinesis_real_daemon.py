"""The real KCL MultiLangDaemon (the JARs that kclpy-ext ships) drives our record processor and a
kclpy one, against moto's Kinesis and DynamoDB served over cleartext HTTP/2 by hypercorn.

Skipped, with the reason, only where Java or the JARs are absent. Each run takes the KCL's
start-up and is marked e2e. On an empty lease table the KCL first waits a random 1-30 s
(``Scheduler.shouldInitiateLeaseSync``, for another worker to fill it): one scenario starts
so, the others join a table whose shards another worker has already leased (``_leased``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_kinesis_e2e import KCLPY_PROCESSOR

pytestmark = pytest.mark.e2e

PEERS = Path(__file__).resolve().parent / "peers"
RECORDS = 40
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


def _jars() -> Path | None:
    spec = importlib.util.find_spec("amazon_kclpy")
    if spec is None or spec.origin is None:
        return None
    jars = Path(spec.origin).parent / "jars"
    return jars if any(jars.glob("amazon-kinesis-client-multilang-*.jar")) else None


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@pytest.fixture(scope="module")
def jars() -> Path:
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: the real MultiLangDaemon cannot run here")
    found = _jars()
    if found is None:
        pytest.skip("the MultiLangDaemon JARs (kclpy-ext's amazon_kclpy/jars) are not installed")
    return found


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory) -> str:
    """moto under hypercorn on a free port (hypercorn with --workers 0 ends on SIGTERM)."""
    log = tmp_path_factory.mktemp("emulator") / "hypercorn.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "hypercorn", "--workers", "0", "--bind", "127.0.0.1:0", "moto_app:app"],
            cwd=PEERS,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CREDENTIALS},
        )
    try:
        port = _wait(lambda: re.search(r"127\.0\.0\.1:(\d+)", log.read_text()), 60, "hypercorn's ready line")
        yield f"http://127.0.0.1:{port.group(1)}"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def _client(service: str, endpoint: str):
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", **_keys())


def _keys() -> dict:
    return {"aws_access_key_id": "test", "aws_secret_access_key": "test"}


def _stream(endpoint: str, name: str, leased: bool = True) -> None:
    """Two shards and RECORDS records, keys ``pk-<n>``, data ``event <n>``; with ``leased``, the
    shards' leases already in the application's table (``_leased``)."""
    kinesis = _client("kinesis", endpoint)
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    for n in range(RECORDS):
        kinesis.put_record(StreamName=name, Data=f"event {n}".encode(), PartitionKey=f"pk-{n}")
    if leased:
        _leased(endpoint, name)


def _leased(endpoint: str, name: str, position: str = "TRIM_HORIZON") -> None:
    """The lease table of application ``name`` as a worker that synced the stream's shards first
    leaves it: a lease per shard at ``position`` (the initial position's name), owned by no one
    (the KCL's own items, fields as its DynamoDBLeaseSerializer writes them). A daemon started
    then skips the KCL's random 1-30 s wait for an empty table to fill, and takes, reads and
    checkpoints these leases as its own; it adds the table's index itself."""
    table = _client("dynamodb", endpoint)
    table.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    table.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})
    for shard in _client("kinesis", endpoint).list_shards(StreamName=name)["Shards"]:
        hashes = shard["HashKeyRange"]
        item = {"leaseKey": {"S": shard["ShardId"]}, "leaseCounter": {"N": "0"}}
        item |= {"ownerSwitchesSinceCheckpoint": {"N": "0"}, "checkpoint": {"S": position}}
        item |= {"checkpointSubSequenceNumber": {"N": "0"}}
        item |= {
            "startingHashKey": {"S": hashes["StartingHashKey"]},
            "endingHashKey": {"S": hashes["EndingHashKey"]},
        }
        table.put_item(TableName=name, Item=item, ConditionExpression="attribute_not_exists(leaseKey)")


def _leases(endpoint: str, application: str) -> dict[str, str]:
    items = _client("dynamodb", endpoint).scan(TableName=application)["Items"]
    return {item["leaseKey"]["S"]: item.get("checkpoint", {}).get("S") for item in items}


def _daemon(
    jars: Path, endpoint: str, tmp_path: Path, name: str, executable: str, env: dict | None = None, **props
) -> subprocess.Popen:
    """The real MLD for stream ``name`` (the application too), its log in ``tmp_path/mld.log``."""
    settings = {
        "executableName": executable,
        "streamName": name,
        "applicationName": name,
        "AwsCredentialsProvider": "DefaultCredentialsProvider",
        "initialPositionInStream": "TRIM_HORIZON",
        "regionName": "us-east-1",
        "kinesisEndpoint": endpoint,
        "dynamoDBEndpoint": endpoint,
        "retrievalMode": "POLLING",
        "metricsLevel": "NONE",
        # the defaults make it wait a minute and more for shard sync and lease assignment
        "shardSyncIntervalMillis": 1000,
        "failoverTimeMillis": 2000,
        "leaseAssignmentIntervalMillis": 1000,
        "parentShardPollIntervalMillis": 1000,
        "idleTimeBetweenReadsInMillis": 500,
        "inMemoryWorkerMetricsCaptureFrequencyMillis": 500,
        "workerMetricsReporterFreqInMillis": 1000,
        **props,
    }
    properties = tmp_path / "app.properties"
    properties.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
    with open(tmp_path / "mld.log", "w") as log:
        return subprocess.Popen(
            ["java", "-Daws.cborEnabled=false", "-cp", f"{jars}/*"]
            + ["software.amazon.kinesis.multilang.MultiLangDaemon", "--properties-file", str(properties)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CREDENTIALS, **(env or {})},
        )


def _stop(mld: subprocess.Popen) -> None:
    mld.send_signal(signal.SIGTERM)
    try:
        mld.wait(timeout=120)
    except subprocess.TimeoutExpired:
        mld.kill()
        raise


#: Scenarios that run at once: each spends much of its time in the KCL's own start-up waits, so
#: together they take about as long as the slowest. The first, on an empty lease table, mostly
#: sleeps through the KCL's random 1-30 s wait: it has a place of its own beside four others.
SCENARIOS: dict[str, Callable[[str, str, Path], None]] = {}
AT_ONCE = 5


def _at_once(scenario: Callable[[str, str, Path], None]) -> Callable:
    """Register ``scenario``; the test of its name raises what the scenario raised when run."""
    SCENARIOS[scenario.__name__] = scenario

    def test(outcomes: dict[str, BaseException | None]) -> None:
        error = outcomes[scenario.__name__]
        if error is not None:
            raise error

    test.__name__, test.__doc__ = scenario.__name__, scenario.__doc__
    return test


@pytest.fixture(scope="module")
def outcomes(request, jars, endpoint, tmp_path_factory) -> dict[str, BaseException | None]:
    """Every selected scenario, run in threads up to AT_ONCE at a time, each in a folder of its own,
    against the one emulator: what each raised (an assertion, a skip), or None."""
    chosen = {item.name for item in request.session.items if getattr(item, "module", None) is request.module}

    def run(name: str) -> BaseException | None:
        try:
            SCENARIOS[name](jars, endpoint, tmp_path_factory.mktemp(name[5:40]))
        except BaseException as err:  # noqa: BLE001 - the test of that name raises it
            return err
        return None

    with ThreadPoolExecutor(AT_ONCE) as pool:
        futures = {name: pool.submit(run, name) for name in SCENARIOS if name in chosen}
    return {name: future.result() for name, future in futures.items()}


@_at_once
def test_mock_processor_under_the_real_daemon_gets_every_record_once(jars, endpoint, tmp_path):
    """On an empty lease table: the daemon waits for it to fill, then leases the shards itself."""
    name = "mockproc"
    _stream(endpoint, name, leased=False)
    out = tmp_path / "out-{shard}.jsonl"
    # Each processor's exit code kept by a wrapper that shares its descriptors (the daemon sees it
    # as the processor): the daemon's default stop has no grace, and its JVM exits, closing their
    # stderr, before they write their summary.
    wrapper = tmp_path / "exit_code.py"
    wrapper.write_text(
        "import os, subprocess, sys\n"
        "code = subprocess.call([sys.executable, '-m', 'wallaroo_proto_cli', *sys.argv[1:]])\n"
        f"path = os.path.join({str(tmp_path)!r}, f'exit-{{os.getpid()}}')\n"
        "with open(path + '.tmp', 'w') as f:\n"
        "    f.write(str(code))\n"
        "os.replace(path + '.tmp', path + '.code')\n"
        "sys.exit(code)\n"
    )
    executable = f"{sys.executable} {wrapper} kinesis mock-processor --checkpoint-every 5 --out {out}"
    mld = _daemon(jars, endpoint, tmp_path, name, executable)
    try:

        def rows() -> list[dict]:
            return [
                json.loads(line) for p in tmp_path.glob("out-*.jsonl") for line in p.read_text().splitlines()
            ]

        _wait(lambda: len(rows()) >= RECORDS, 300, f"{RECORDS} records")
        got = rows()
        largest = {}
        for r in got:
            largest[r["shard"]] = max(largest.get(r["shard"], 0), int(r["sequenceNumber"]))
        # the daemon accepted each shard's checkpoint at its last record
        _wait(
            lambda: {k: int(v) for k, v in _leases(endpoint, name).items() if v and v.isdigit()} == largest,
            120,
            f"the lease table's checkpoints at {largest}",
        )
    finally:
        _stop(mld)
    assert sorted(r["data"] for r in got) == sorted(f"event {n}" for n in range(RECORDS))
    assert len(got) == RECORDS and len({r["shard"] for r in got}) == 2

    def codes() -> list[str] | None:
        found = [p.read_text() for p in tmp_path.glob("exit-*.code")]
        return found if len(found) >= 2 else None

    got_codes = _wait(codes, 120, "both processors' exit")
    assert set(got_codes) == {"0"}, got_codes


def _kclpy_events(jars, endpoint, tmp_path, name, **props) -> list[dict]:
    pytest.importorskip("amazon_kclpy")
    app = tmp_path / "app.py"
    app.write_text(KCLPY_PROCESSOR)
    log = tmp_path / "events.jsonl"
    _stream(endpoint, name)
    env = {"KCL_TEST_LOG": str(log)}  # the daemon's children inherit its environment
    mld = _daemon(jars, endpoint, tmp_path, name, f"{sys.executable} {app}", env, **props)
    try:

        def events() -> list[dict]:
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        _wait(lambda: sum(e["event"] == "record" for e in events()) >= RECORDS, 300, f"{RECORDS} records")
        _wait(
            lambda: len(_leases(endpoint, name)) == 2 and all(_leases(endpoint, name).values()),
            120,
            "checkpoints",
        )
    finally:
        _stop(mld)
    return events()


@_at_once
def test_a_kclpy_processor_under_the_real_daemon_stopped_without_grace_gets_no_lease_lost(
    jars, endpoint, tmp_path
):
    events = _kclpy_events(jars, endpoint, tmp_path, "kclpynograce")
    records = [e for e in events if e["event"] == "record"]
    assert sorted(e["data"] for e in records) == sorted(f"event {n}" for n in range(RECORDS))
    assert not [e for e in events if e["event"] == "checkpoint_error"]
    # the KCL's default shutdownGraceMillis (0): stdin closes, no shutdownRequested, no leaseLost
    assert not [e for e in events if e["event"] in ("shutdownRequested", "leaseLost")], events


@_at_once
def test_a_kclpy_processor_under_the_real_daemon_stopped_with_grace_gets_shutdown_requested(
    jars, endpoint, tmp_path
):
    events = _kclpy_events(jars, endpoint, tmp_path, "kclpygrace", shutdownGraceMillis=20000)
    ends = Counter(e["event"] for e in events if e["event"] in ("shutdownRequested", "leaseLost"))
    assert ends == {"shutdownRequested": 2, "leaseLost": 2}, events
    for shard in {e["shard"] for e in events}:
        mine = [e["event"] for e in events if e["shard"] == shard]
        assert mine.index("shutdownRequested") < mine.index("leaseLost")


def _kpl_aggregate(partition_key: str, payloads: list[bytes]) -> bytes:
    """A KPL aggregated record, written here from its format: magic F3 89 9A C2, the protobuf
    AggregatedRecord (1: partition key table; 3: records, each 1: key index, 3: data), its MD5."""

    def field(number: int, body: bytes) -> bytes:
        assert len(body) < 128  # one-byte lengths keep this writer short
        return bytes([number << 3 | 2, len(body)]) + body

    records = b"".join(field(3, b"\x08\x00" + field(3, data)) for data in payloads)
    message = field(1, partition_key.encode()) + records
    return b"\xf3\x89\x9a\xc2" + message + hashlib.md5(message).digest()


@_at_once
def test_the_real_daemon_deaggregates_kpl_records_and_takes_a_checkpoint_inside_one(jars, endpoint, tmp_path):
    name = "aggregated"
    kinesis = _client("kinesis", endpoint)
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    _leased(endpoint, name)
    payloads = [f"user record {n}".encode() for n in range(4)]
    kinesis.put_record(StreamName=name, Data=b"plain", PartitionKey="pk-b")
    kinesis.put_record(StreamName=name, Data=_kpl_aggregate("pk-a", payloads), PartitionKey="pk-a")
    out = tmp_path / "out.jsonl"
    executable = (
        f"{sys.executable} -m wallaroo_proto_cli kinesis mock-processor --checkpoint-every 3 --out {out}"
    )
    mld = _daemon(jars, endpoint, tmp_path, name, executable)
    try:
        rows = _wait(
            lambda: len(lines := out.read_text().splitlines() if out.exists() else []) >= 5 and lines,
            300,
            "5 records",
        )
        got = [json.loads(line) for line in rows]
        # mock-processor checkpoints at its last record, (aggregate, 3): the daemon keeps both numbers
        table = _client("dynamodb", endpoint)

        def lease() -> tuple | None:
            (item,) = table.scan(TableName=name)["Items"]
            at = (item.get("checkpoint", {}).get("S"), item.get("checkpointSubSequenceNumber", {}).get("N"))
            return at if at[0] == got[-1]["sequenceNumber"] else None

        assert _wait(lease, 120, "the checkpoint inside the aggregate") == (got[-1]["sequenceNumber"], "3")
    finally:
        _stop(mld)
    assert [r["data"] for r in got] == ["plain"] + [p.decode() for p in payloads]
    assert [r["subSequenceNumber"] for r in got] == [0, 0, 1, 2, 3]
    assert (
        len({r["sequenceNumber"] for r in got[1:]}) == 1
        and got[0]["sequenceNumber"] != got[1]["sequenceNumber"]
    )


@_at_once
def test_the_real_daemon_closes_a_broken_processors_input_and_exits_1(jars, endpoint, tmp_path):
    """A wrong responseFor: the MLD closes that processor's input, waits for it, stops and exits 1
    (mock-daemon does the same, and kills nothing)."""
    name = "broken"
    _stream(endpoint, name)
    executable = f"{sys.executable} -m wallaroo_proto_cli kinesis mock-processor --bad-response-after 1"
    mld = _daemon(jars, endpoint, tmp_path, name, executable)
    try:
        code = mld.wait(timeout=300)
    except subprocess.TimeoutExpired:
        mld.kill()
        raise
    log = (tmp_path / "mld.log").read_text()
    assert code == 1, log[-3000:]
    assert "processRecordz" in log
    # its input closed and its exit awaited; mock-processor takes that as its end (exit 0). The JVM's
    # exit races the other shard's log lines, so at least one of each is certain.
    assert "Child process exited with value: 0" in log and not re.search(r"exited with value: [1-9]", log)
    assert "end: input closed (daemon stopped)" in log


# A processor that keeps every line the daemon sends it (one file per shard) and answers as kclpy
# does, checkpointing at the last record of each batch.
LINE_KEEPER = r"""
import json, sys
out, shard = sys.argv[1], None
def send(obj):
    sys.stdout.write("\n" + json.dumps(obj) + "\n"); sys.stdout.flush()
def keep(line):
    with open(out.replace("{shard}", shard), "a") as f:
        f.write(line)
for line in sys.stdin:
    msg = json.loads(line)
    shard = shard or msg["shardId"]
    keep(line)
    if msg["action"] == "processRecords" and msg["records"]:
        last = msg["records"][-1]
        send({"action": "checkpoint", "sequenceNumber": last["sequenceNumber"],
              "subSequenceNumber": last["subSequenceNumber"]})
        keep(sys.stdin.readline())
    send({"action": "status", "responseFor": msg["action"]})
"""


def _masked(path: Path) -> list[dict]:
    """The daemon's lines, sequence numbers, arrival times and lag aside."""
    lines = []
    for line in path.read_text().splitlines():
        msg = json.loads(line)
        for key in ("sequenceNumber", "millisBehindLatest"):
            if key in msg and msg[key] not in (None, "TRIM_HORIZON"):
                msg[key] = "?"
        for record in msg.get("records", []):
            record["sequenceNumber"] = record["approximateArrivalTimestamp"] = "?"
        lines.append(msg)
    return lines


@_at_once
def test_the_real_daemon_and_mock_daemon_send_the_same_lines(jars, endpoint, tmp_path):
    """The same records and keys, the same processor: line for line the same per shard."""
    name = "differential"
    _stream(endpoint, name)
    real, mock = tmp_path / "real", tmp_path / "mock"
    real.mkdir()
    mock.mkdir()
    keeper = tmp_path / "keeper.py"
    keeper.write_text(LINE_KEEPER)
    mld = _daemon(jars, endpoint, real, name, f"{sys.executable} {keeper} {real}/{{shard}}.jsonl")
    try:

        def records() -> int:
            return sum(
                len(json.loads(line).get("records", []))
                for p in real.glob("*.jsonl")
                for line in p.read_text().splitlines()
            )

        _wait(
            lambda: records() >= RECORDS and len(list(real.glob("*.jsonl"))) == 2, 300, f"{RECORDS} records"
        )
        _wait(
            lambda: all(_leases(endpoint, name).values()) and len(_leases(endpoint, name)) == 2,
            120,
            "checkpoints",
        )
    finally:
        _stop(mld)
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"event {n}\n" for n in range(RECORDS)))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "wallaroo_proto_cli", "kinesis", "mock-daemon", "--shards", "2"]
        + ["--input", str(lines), "--key", "pk-{n}", "--wait-at-end", "--"]
        + [sys.executable, str(keeper), f"{mock}/{{shard}}.jsonl"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait(
        lambda: (
            sum(len(_masked(p)) for p in mock.glob("*.jsonl"))
            >= sum(len(_masked(p)) for p in real.glob("*.jsonl"))
        ),
        120,
        "mock-daemon's lines",
    )
    daemon.send_signal(signal.SIGTERM)
    _, err = daemon.communicate(timeout=120)
    assert daemon.returncode == 0, err
    for shard in ("shardId-000000000000", "shardId-000000000001"):
        assert _masked(mock / f"{shard}.jsonl") == _masked(real / f"{shard}.jsonl"), shard


def _split_midway(jars, endpoint, tmp_path, name: str, executable: str, received, env: dict | None = None):
    """Half the records into two shards, the daemon started, shard 0 split once that half is
    read, the other half put (into shard 1 and the children); waits for every record and the
    parent's lease at SHARD_END, which the KCL writes only when the processor checkpointed at
    shardEnded. Returns the parent's id and its children's."""
    kinesis = _client("kinesis", endpoint)
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    _leased(endpoint, name)

    def put(numbers: range) -> None:
        for n in numbers:
            kinesis.put_record(StreamName=name, Data=f"event {n}".encode(), PartitionKey=f"pk-{n}")

    put(range(RECORDS // 2))
    mld = _daemon(jars, endpoint, tmp_path, name, executable, env)
    try:
        _wait(lambda: len(received()) >= RECORDS // 2, 300, f"{RECORDS // 2} records")
        parent, other = kinesis.list_shards(StreamName=name)["Shards"]
        low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        kinesis.split_shard(
            StreamName=name, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((low + high) // 2)
        )
        children = {s["ShardId"] for s in kinesis.list_shards(StreamName=name)["Shards"]}
        children -= {parent["ShardId"], other["ShardId"]}
        put(range(RECORDS // 2, RECORDS))
        _wait(lambda: len(received()) >= RECORDS, 300, f"{RECORDS} records")
        _wait(
            lambda: _leases(endpoint, name).get(parent["ShardId"]) == "SHARD_END",
            120,
            "the parent's lease at SHARD_END",
        )
    finally:
        _stop(mld)
    assert len(children) == 2
    return parent["ShardId"], children


@_at_once
def test_a_split_under_the_real_daemon_ends_mock_processors_parent_and_starts_its_children(
    jars, endpoint, tmp_path
):
    """mock-processor checkpoints at shardEnded (the parent's lease reaches SHARD_END), each
    child is read from TRIM_HORIZON, and every record arrives once."""
    name = "reshardmock"
    out = tmp_path / "out-{shard}.jsonl"
    executable = (
        f"{sys.executable} -m wallaroo_proto_cli kinesis mock-processor --checkpoint-every 5 --out {out}"
    )

    def rows() -> list[dict]:
        return [json.loads(line) for p in tmp_path.glob("out-*.jsonl") for line in p.read_text().splitlines()]

    parent, children = _split_midway(jars, endpoint, tmp_path, name, executable, rows)
    got = rows()
    assert sorted(r["data"] for r in got) == sorted(f"event {n}" for n in range(RECORDS))
    assert {r["shard"] for r in got} & children
    # the daemon's own account of where it started each child (its initialize carries the same)
    log = (tmp_path / "mld.log").read_text()
    for child in children:
        assert f"Initializing shard {name}:{child} with TRIM_HORIZON" in log, child


@_at_once
def test_a_split_under_the_real_daemon_ends_a_kclpy_parent_and_starts_its_children_at_trim_horizon(
    jars, endpoint, tmp_path
):
    """The kclpy processor's own account: shardEnded then its checkpoint on the parent, each
    child's initialize at TRIM_HORIZON only after that, every record once."""
    pytest.importorskip("amazon_kclpy")
    app = tmp_path / "app.py"
    app.write_text(KCLPY_PROCESSOR)
    log = tmp_path / "events.jsonl"

    def events() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def records() -> list[dict]:
        return [e for e in events() if e["event"] == "record"]

    parent, children = _split_midway(
        jars,
        endpoint,
        tmp_path,
        "reshardkclpy",
        f"{sys.executable} {app}",
        records,
        {"KCL_TEST_LOG": str(log)},
    )
    got = events()
    assert sorted(e["data"] for e in records()) == sorted(f"event {n}" for n in range(RECORDS))
    mine = [e["event"] for e in got if e["shard"] == parent]
    assert "shardEnded" in mine and mine[mine.index("shardEnded") + 1] == "checkpoint", mine
    starts = {e["shard"]: e["sequenceNumber"] for e in got if e["event"] == "initialize"}
    assert {starts.get(child) for child in children} == {"TRIM_HORIZON"}, starts
    assert {e["shard"] for e in records()} & children
    ended = next(i for i, e in enumerate(got) if e["event"] == "shardEnded")
    assert all(i > ended for i, e in enumerate(got) if e["shard"] in children), got
