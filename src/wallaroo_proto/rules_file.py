"""The one reader of rule files (the mock sink's faults, the proxy's rules) and of TOML values.

Rule files are data, never code: TOML (``.json`` as JSON where the caller allows it), read
whole as UTF-8. Why a file cannot be used is kept apart (unreadable, not UTF-8, not the
format) so each command says it in its own, unchanged words; TOML's own messages already
name the line and column.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any


class RulesFileError(ValueError):
    """A rules file that could not be read or parsed: ``cause`` is why, ``syntax`` says whether
    it was read but is not TOML (or JSON)."""

    def __init__(self, path: str | Path, cause: Exception) -> None:
        self.path = path
        self.cause = cause
        self.syntax = isinstance(cause, (tomllib.TOMLDecodeError, json.JSONDecodeError))
        super().__init__(f"{path}: {cause}")


def read_rules_file(path: str | Path, *, json_suffix: bool = False, text_mode: bool = False) -> Any:
    """The parsed document of a rules file.

    ``json_suffix``: a ``.json`` file (any case) is JSON. ``text_mode``: read as Python's text
    files are, a lone CR a line end (the mock sink always read its faults so).
    """
    try:
        if text_mode:
            text = Path(path).read_text(encoding="utf-8")
        else:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RulesFileError(path, err) from err
    try:
        if json_suffix and Path(path).suffix.lower() == ".json":
            return json.loads(text)
        return tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise RulesFileError(path, err) from err


def toml_value(raw: str) -> Any:
    """``raw`` as TOML reads a value (``0``, ``true``, ``"x"``, ``[1, 2]``), else the text itself."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
