"""``restart_by_pidfile.py PIDFILE LOG COMMAND...``: kill -9 the process PIDFILE names, start COMMAND.

The conformance tests give it to ``conformance sink --restart-cmd``: it kills the sink
under test the hard way, waits until it is gone, starts it again in a session of its
own (so it outlives this script) with its output appended to LOG, and writes the new
pid to PIDFILE for the next restart and for the test's cleanup.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    pidfile, log, *command = sys.argv[1:]
    text = Path(pidfile).read_text().strip() if Path(pidfile).exists() else ""
    if text.isdigit() and int(text) > 1:
        pid = int(text)
        try:
            os.kill(pid, signal.SIGKILL)
            while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text():
                time.sleep(0.02)
        except (ProcessLookupError, FileNotFoundError):
            pass
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
        )
    Path(pidfile).write_text(str(proc.pid))


if __name__ == "__main__":
    main()
