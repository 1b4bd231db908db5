"""A Spark standalone cluster on loopback, started from the pyspark installation itself.

One master and N workers, each a ``spark-class`` JVM (the same launcher as
Spark's ``sbin/start-master.sh`` and ``start-worker.sh``) on 127.0.0.1 with a
free RPC port and its web UI on a free port. Start-up waits on what the
processes log (the master's URL, each worker's registration), never on a
fixed time; ``stop`` ends every process it started, also when start-up failed.

    with StandaloneCluster(workers=2, cores=1, memory="512m") as cluster:
        run spark-replay --master cluster.master_url --conf ... (see ``driver_conf``)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"


class ClusterError(Exception):
    """The cluster did not come up: which process, why, and the tail of its log."""


def spark_home() -> Path:
    """The Spark distribution inside the pyspark package (its ``bin/spark-class`` and jars)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers with ``cores`` and ``memory`` each, on 127.0.0.1."""

    workers: int = 2
    cores: int = 1
    memory: str = "512m"
    timeout: float = 180.0
    workdir: Path | None = None
    #: More environment for every process: a worker hands its own to the executors it starts
    #: (credentials and endpoints for object storage, as a real node has in its environment).
    env: dict[str, str] = field(default_factory=dict)
    master_url: str = ""
    _processes: list[tuple[str, subprocess.Popen, Path]] = field(default_factory=list)
    _own_workdir: bool = False

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def driver_conf(self, executor_memory: str | None = None) -> list[tuple[str, str]]:
        """What a driver on this machine sets to use the whole cluster over loopback."""
        return [
            ("spark.driver.host", "127.0.0.1"),
            ("spark.driver.bindAddress", "127.0.0.1"),
            ("spark.executor.memory", executor_memory or self.memory),
            ("spark.executor.cores", str(self.cores)),
            ("spark.cores.max", str(self.cores * self.workers)),
        ]

    def start(self) -> None:
        """Start the master, then the workers; return when every worker has registered."""
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="wallaroo-standalone-"))
            self._own_workdir = True
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            master_log = self._launch("master", MASTER_CLASS, "--host", "127.0.0.1", "--port", "0")
            deadline = time.monotonic() + self.timeout
            found = self._wait_for("master", master_log, lambda text: _MASTER_URL.search(text), deadline)
            self.master_url = found.group(1)
            logs = [
                self._launch(
                    f"worker{n}",
                    WORKER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(self.workdir / f"worker{n}-work"),
                    self.master_url,
                )
                for n in range(1, self.workers + 1)
            ]
            for n, log in enumerate(logs, 1):
                self._wait_for(f"worker{n}", log, lambda text: _REGISTERED in text, deadline)
        except BaseException:
            self.stop()
            raise

    def _launch(self, name: str, main_class: str, *args: str) -> Path:
        assert self.workdir is not None
        log = self.workdir / f"{name}.log"
        env = {**os.environ, **self.env}
        env.update(
            {
                "SPARK_HOME": str(spark_home()),
                "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_WORKER_DIR": str(self.workdir / f"{name}-work"),
                "SPARK_LOG_DIR": str(self.workdir),
                "SPARK_NO_DAEMONIZE": "1",
                # The web UIs on free ports; a master or worker daemon needs little heap.
                "SPARK_MASTER_WEBUI_PORT": "0",
                "SPARK_WORKER_WEBUI_PORT": "0",
                "SPARK_DAEMON_MEMORY": "256m",
            }
        )
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main_class, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,  # its own process group: stop() ends the JVM and its launcher
            )
        self._processes.append((name, process, log))
        return log

    def _wait_for(self, name: str, log: Path, condition, deadline: float):
        process = next(p for n, p, _ in self._processes if n == name)
        while True:
            text = log.read_text(errors="replace")
            found = condition(text)
            if found:
                return found
            if process.poll() is not None:
                raise ClusterError(f"{name} exited with {process.returncode}: {_tail(text)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} not ready after {self.timeout:.0f} s: {_tail(text)}")
            time.sleep(0.1)  # polling its log for the condition, not a wait for a time

    def logs(self) -> dict[str, str]:
        """Each process's log so far (for a failing test's message)."""
        return {name: log.read_text(errors="replace") for name, _, log in self._processes if log.exists()}

    def stop(self, timeout: float = 30.0) -> None:
        """End the workers, then the master: SIGTERM to each process group, SIGKILL after ``timeout``."""
        for _, process, _ in reversed(self._processes):
            if process.poll() is None:
                _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, process, _ in reversed(self._processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._processes.clear()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"
