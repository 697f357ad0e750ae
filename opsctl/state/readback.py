"""Reading back the JSON files opsctl wrote (node records, saved plans, failover reports): parsed, then read as
their records (base.record's saved formats) field by field.

Each problem is a FileProblem: `error: <file>: what is wrong` and a hint saying how to fix it, never a
Python exception from deep inside a reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn, TypeVar

from opsctl.base.frozen import Frozen
from opsctl.base.record import DataMismatch, Versioned, read_fields
from opsctl.state.safefs import READ_LIMIT, FileProblem, read_bounded

F = TypeVar("F", bound=Frozen)


def parse_json(text: str, path: Path | str, hint: str) -> object:
    """A JSON value, not yet checked: read_record then reads it as its record, field by field."""
    if not text.strip():
        raise FileProblem(path, "is empty (truncated?)", hint)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise FileProblem(path, f"is not valid JSON{where}: {getattr(exc, 'msg', exc)}", hint) from None
    except RecursionError:
        raise FileProblem(path, "is nested too deeply to be an opsctl file", hint) from None


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def load_json(path: Path | str, hint: str, limit: int = READ_LIMIT, follow: bool = True) -> object:
    """A JSON file's value; a missing file is a problem too (callers that allow it check first)."""
    text = read_bounded(path, hint, limit, follow=follow)
    if text is None:
        raise FileProblem(path, "does not exist", hint)
    return parse_json(text, path, hint)


def read_record(cls: type[F], data: object, path: Path | str, hint: str, where: str = "") -> F:
    """A record of a saved format (base.record.Versioned, or any @frozen record) from a file's JSON value, every
    field checked by its type; a FileProblem naming the file and the field otherwise."""
    try:
        return cls.from_json(data, where) if issubclass(cls, Versioned) else read_fields(cls, data, where)
    except DataMismatch as exc:
        raise FileProblem(path, str(exc), hint) from None
