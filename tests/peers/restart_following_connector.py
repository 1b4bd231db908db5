"""The shipped connector of ``shipped_connector.py``, with its RESTART handling fixed.

Run as ``shipped_connector.py`` is (same arguments, PYTHONPATH set to the shipped peers).
The shipped ``handle_restart`` closes the connection, then raises ``OSError`` outside
the library's reconnect loop: ``handle_error`` closes for good and ``join()`` never
returns. The replacement takes the reconnect address the RESTART may carry, then goes
the library's own way for a lost connection (``handle_close``: close, reconnect, HELLO,
NOTIFY every stream again), which is what the protocol asks of a connector that
receives a RESTART. Everything else is the shipped library as it is.
"""

import sys
from pathlib import Path

from wallaroo.experimental import AtLeastOnceSourceConnector


def handle_restart(self, msg) -> None:
    if msg.address:
        host, port = msg.address.rsplit(":", 1)
        self._host, self._port = host, int(port)
    print(f"RESTART followed: address {msg.address!r}", flush=True)
    self.handle_close()


AtLeastOnceSourceConnector.handle_restart = handle_restart

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import shipped_connector

    shipped_connector.main()
