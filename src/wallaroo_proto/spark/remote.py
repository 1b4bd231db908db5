"""Captures on object storage (``s3://``, ``gs://``, ``hdfs://``, ``abfs://``, any fsspec URL).

The driver lists a URL (``list_url``: an object, a prefix read recursively, or a
glob); each executor task opens its capture with ``open_url``, a buffered file
that reads ``BLOCK_SIZE`` bytes ahead with ranged GETs, so a task streams its
capture rather than downloading it first. Credentials and endpoints are fsspec's
and each store's own (for S3: the AWS SDK's environment and config files), never
arguments. fsspec is imported only when a URL is given, so local paths pay nothing.
"""

from __future__ import annotations

import re
from typing import BinaryIO

#: Bytes each ranged read fetches ahead: a task holds about this much of its capture at a time.
BLOCK_SIZE = 8 * 1024 * 1024
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(text: str) -> bool:
    """Whether ``text`` names a capture by URL (``scheme://``) rather than by local path."""
    return bool(_URL.match(text))


def reason(err: BaseException) -> str:
    """An error from a store as one short line (its own exceptions are not all OSErrors)."""
    if isinstance(err, PermissionError):  # S3 says "Forbidden" to a HEAD, "Access Denied" to a GET
        return "access denied"
    text = (getattr(err, "strerror", None) or str(err) or type(err).__name__).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def _filesystem(url: str):
    try:
        import fsspec
    except ImportError:
        raise OSError("reading URLs needs fsspec: pip install 'wallaroo-proto[spark,s3]'") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:  # no implementation for the scheme: says what to install
        raise OSError(reason(err)) from None


def list_url(given: str, suffixes: tuple[str, ...]) -> tuple[list[tuple[str, int]], str | None]:
    """The ``(url, size)`` of each capture ``given`` names, and why it names none (else None).

    An object is itself; a prefix ("directory") its objects ending in ``suffixes``, recursively;
    a glob its matches. URLs keep the scheme, as the user wrote ``given``.
    """
    try:
        fs, root = _filesystem(given)
        if any(ch in root for ch in "*?["):
            found = fs.glob(root, detail=True)
            why = "no object matches this pattern"
        else:
            try:
                info = fs.info(root)
            except FileNotFoundError as err:
                # A missing key comes back as its own name; a missing bucket as the store's words.
                return [], "no such object or prefix" if str(err).strip("'\"") in ("", root) else reason(err)
            if info.get("type") != "directory":
                return [(given, int(info["size"]))], None
            found = {p: i for p, i in fs.find(root, detail=True).items() if p.lower().endswith(suffixes)}
            why = "prefix holds no .pcap, .pcapng or .cap objects"
        found = sorted((p, i) for p, i in found.items() if i["type"] == "file")
        files = [(fs.unstrip_protocol(path), int(info["size"])) for path, info in found]
        return files, None if files else why
    except Exception as err:  # the store's own errors (credentials, endpoint, denied): one line
        return [], f"cannot read: {reason(err)}"


class _RemoteFile:
    """A store's file whose failures are OSErrors, as a local file's are: the reader names them."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def read(self, n: int = -1) -> bytes:
        try:
            return self._f.read(n)
        except Exception as err:
            raise OSError(reason(err)) from err

    def __getattr__(self, name: str):
        return getattr(self._f, name)

    def __enter__(self) -> _RemoteFile:
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


def open_url(url: str) -> _RemoteFile:
    """Open ``url`` for sequential reading in ``BLOCK_SIZE`` ranged reads (read-ahead cache)."""
    try:
        fs, path = _filesystem(url)
        return _RemoteFile(fs.open(path, "rb", block_size=BLOCK_SIZE, cache_type="readahead"))
    except Exception as err:
        raise OSError(reason(err)) from err
