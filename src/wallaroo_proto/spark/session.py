"""A SparkSession for spark-replay: any master, quiet, with our code on the executors.

Spark writes a lot to the console (log4j lines, JVM warnings, a progress bar
that fights with rich). The JVM's own stdout and stderr go to a log file
instead, the log level is WARN there, the console progress bar is off, and
``stage_progress`` draws one rich bar per running stage from the status
tracker. The wallaroo_proto package is zipped and shipped with
``addPyFile``, so executors on a cluster run the same dissector as the driver
without installing anything.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..main_thread_signals import entered_without_signals, signals_blocked

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
APP_NAME = "wallaroo-proto spark-replay"
PACKAGE_DIR = Path(__file__).resolve().parent.parent

_LOG4J = """\
status = error
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
"""


class SparkStartError(Exception):
    """Spark could not start (no Java, a bad master URL...): the reason and where the log is."""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


#: Seconds to wait for a standalone master's port before giving up (Spark itself would try for 60).
MASTER_CONNECT_TIMEOUT = 10.0


def check_master_reachable(master: str, timeout: float = MASTER_CONNECT_TIMEOUT) -> None:
    """Refuse a standalone master nobody listens at, at once: Spark would retry for a minute,
    then fail with a stack trace about a stopped context."""
    if not master.startswith("spark://"):
        return
    reasons = []
    for address in master[len("spark://") :].split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise SparkStartError(f"master {master!r}: {address!r} is not HOST:PORT")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
            return
        except OSError as err:
            reasons.append(f"{address}: {err.strerror or err}")
    raise SparkStartError(f"cannot reach the Spark master {master!r} ({'; '.join(reasons)})")


def quiet_query_errors() -> None:
    """PySpark logs every failed query, with its Java stack, as JSON on stderr before raising it;
    the caller already reports the error in one line."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def package_zip(directory: str | os.PathLike) -> Path:
    """Zip the wallaroo_proto package (sources only) for ``addPyFile``."""
    target = Path(directory) / "wallaroo_proto.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(PACKAGE_DIR.rglob("*.py")):
            if "__pycache__" not in path.parts:
                archive.write(path, Path("wallaroo_proto") / path.relative_to(PACKAGE_DIR))
    return target


def ship_package(sc: SparkContext, directory: str | os.PathLike | None = None) -> None:
    """Give the session's Python workers this package (once per context: ``addPyFile``)."""
    if getattr(sc, "_wallaroo_shipped", False):
        return
    if directory is None:
        # Spark serves the zip from here for as long as the driver runs: removed when it exits.
        directory = tempfile.mkdtemp(prefix="wallaroo-spark-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    sc.addPyFile(str(package_zip(directory)))
    sc._wallaroo_shipped = True  # type: ignore[attr-defined]


def build_session(
    master: str = DEFAULT_MASTER,
    *,
    conf: Iterable[tuple[str, str]] = (),
    log_dir: str | os.PathLike | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """Start (or join) a SparkSession on ``master`` with the package shipped to its executors.

    ``conf`` pairs override the defaults (e.g. ``spark.driver.memory``). The JVM's
    console output goes to ``spark.log`` in ``log_dir`` (a temporary directory by default).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    workdir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="wallaroo-spark-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log4j = workdir / "log4j2.properties"
    log4j.write_text(_LOG4J.format(level=log_level.lower()))
    log_path = workdir / "spark.log"

    # Executors run this interpreter (same venv) in local mode; on a cluster, set PYSPARK_PYTHON.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark_conf = SparkConf().setMaster(master).setAppName(APP_NAME)
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j.as_uri()}",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.sql.adaptive.enabled": "true",
        # A query of the data source hands its filters to the capture reader, which skips captures,
        # connections and times they rule out (spark.pushdown; spark-replay itself reads and caches
        # everything once). Off, the reader reads everything, as correctly.
        "spark.sql.python.filterPushdown.enabled": "true",
    }
    if is_local(master):
        # Loopback only: the driver and its executors are this machine.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        defaults.update(
            {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.driver.memory": "2g",
                "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j.as_uri()}",
                # Small shuffles: report tables have one row per connection or stream.
                "spark.sql.shuffle.partitions": "4",
            }
        )
    for key, value in defaults.items():
        spark_conf.set(key, value)
    for key, value in conf:
        spark_conf.set(key, value)

    quiet_query_errors()
    if SparkContext._active_spark_context is None:
        check_master_reachable(master)
        log = open(log_path, "ab")  # noqa: SIM115 - the JVM keeps its own copy of the descriptor
        try:
            gateway = SparkContext._gateway
            if gateway is None:
                gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": log, "stderr": log})
            sc = SparkContext(conf=spark_conf, gateway=gateway)
            # A master that took the connection but never registered us stops the context here.
            ship_package(sc, workdir)
        except Exception as err:  # Java missing, bad master URL, port trouble, an unresponsive master...
            reason = _log_reason(log_path) or _first_line(err)
            if SparkContext._active_spark_context is not None:
                SparkContext._active_spark_context.stop()
            raise SparkStartError(
                f"Spark did not start on master {master!r}: {reason} (log: {log_path})"
            ) from None
        finally:
            log.close()
    else:
        sc = SparkContext.getOrCreate(spark_conf)  # joined: it was given our package when it started
    sc.setLogLevel(log_level)
    spark = SparkSession(sc)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark._wallaroo_log = log_path  # type: ignore[attr-defined]
    spark._wallaroo_workdir = workdir if log_dir is None else None  # type: ignore[attr-defined]
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop Spark and remove the temporary directory ``build_session`` made (log and package zip)."""
    spark.stop()
    workdir = getattr(spark, "_wallaroo_workdir", None)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def spark_failure(spark: SparkSession, err: BaseException) -> str:
    """Why Spark failed under a running session, in one line: the JVM log's reason or the error."""
    log_path = getattr(spark, "_wallaroo_log", None)
    reason = (_log_reason(log_path) if log_path else None) or _first_line(err)
    return f"{reason} (log: {log_path})" if log_path else reason


def _log_reason(log_path: Path) -> str | None:
    """The last exception line the JVM logged (e.g. why a master URL was refused)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:  # a scheduler that gave up says why (an unresponsive master)
        if "Application has been killed. Reason: " in line:
            return line.split("Reason: ", 1)[1].strip()[:300]
    for line in reversed(lines):
        if "Exception:" in line or "Error:" in line:
            return line.strip()[:300]
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:300]


@contextmanager
def stage_progress(
    spark: SparkSession, description: str, console: Console | None = None, *, interval: float = 0.25
) -> Iterator[None]:
    """Show one rich bar per active Spark stage while the body runs its actions.

    Only drawn on a terminal: a pipe or a test gets no progress lines at all.
    """
    sc = spark.sparkContext
    sc.setJobDescription(description)
    console = console or Console(stderr=True)
    if not console.is_terminal:
        try:
            yield
        finally:
            sc.setJobDescription(None)
        return
    progress = Progress(
        TextColumn("[bold blue]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    stop = threading.Event()
    tracker = sc.statusTracker()

    def poll() -> None:
        bars: dict[int, int] = {}
        while not stop.wait(interval):
            try:
                stage_ids = tracker.getActiveStageIds()
                infos = [(sid, tracker.getStageInfo(sid)) for sid in stage_ids]
            except Exception:  # the context is stopping
                return
            for sid, info in infos:
                if info is None:
                    continue
                label = f"{description}: stage {sid}"
                if sid not in bars:
                    bars[sid] = progress.add_task(label, total=max(info.numTasks, 1))
                progress.update(bars[sid], completed=info.numCompletedTasks, total=max(info.numTasks, 1))
            for sid in list(bars):
                if sid not in stage_ids:
                    progress.remove_task(bars.pop(sid))

    thread = threading.Thread(target=poll, name="spark-progress", daemon=True)
    with entered_without_signals(progress):
        try:
            with signals_blocked():
                thread.start()
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            sc.setJobDescription(None)
