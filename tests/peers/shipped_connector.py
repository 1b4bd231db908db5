"""Stream framed files into a worker with the shipped Wallaroo connector library.

Run with PYTHONPATH set to the shipped peers' folder (see tests/test_interop_wallaroo.py):
``shipped_connector.py [--fixed-reset] HOST PORT COOKIE FILE...``. Prints ``join: <what
join() returned>`` and exits 0 when every stream ended and its EOS was acknowledged.

``--fixed-reset`` works around one bug of the shipped ``FramedFileReader``: its
``reset`` calls ``self.__next()``, a name that does not exist, so resuming from any
point of reference but its own position raises AttributeError. The replacement seeks
to the point, which is the end offset of the last record the worker holds (the
reader's message ids are end offsets), i.e. the start of the first record to send.
Everything else is the shipped library as it is.
"""

import sys

from wallaroo.experimental.connectors import FramedFileReader, MultiSourceConnector

FROM_THE_START = 2**64 - 1


class ResumableFramedFileReader(FramedFileReader):
    def reset(self, pos=0):
        self.file.seek(0 if pos == FROM_THE_START else pos)


def main() -> None:
    args = sys.argv[1:]
    reader = FramedFileReader
    if args[0] == "--fixed-reset":
        reader = ResumableFramedFileReader
        args = args[1:]
    host, port, cookie, *files = args
    client = MultiSourceConnector("0.0.1", cookie, "interop test", "connector", host, port)
    client.connect()
    for name in files:
        client.add_source(reader(filename=name))
    result = client.join()
    print(f"join: {result!r}", flush=True)
    sys.exit(0 if result is None else 1)


if __name__ == "__main__":
    main()
