"""Checks for the JSON files opsctl reads back (node records, saved plans, failover reports).

Each problem is a FileProblem: `error: <file>: what is wrong` and a hint saying how to fix it, never a
Python exception from deep inside a reader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import EllipsisType
from typing import Any, NoReturn, TypeVar, overload

from opsctl.base.frozen import Frozen
from opsctl.base.record import DataMismatch, Versioned, found, kind_name, read_fields
from opsctl.state.safefs import READ_LIMIT, FileProblem, read_bounded

T = TypeVar("T")
F = TypeVar("F", bound=Frozen)
D = TypeVar("D")
def parse_json(text: str, path: Path | str, hint: str) -> object:
    """A JSON value, not yet checked: Fields checks each field's kind as it is read."""
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


class Fields:
    """Typed access to one JSON object of a file, each wrong shape a FileProblem naming the field."""

    def __init__(self, data: object, path: Path | str, hint: str, where: str = "") -> None:
        self.path = path
        self.hint = hint
        self.where = where
        if not isinstance(data, dict):
            raise self.problem(f"expected an object, found {found(data)}")
        self.data: dict[str, Any] = data

    def problem(self, what: str, key: str = "") -> FileProblem:
        name = ".".join(p for p in (self.where, key) if p)
        return FileProblem(self.path, f"{name}: {what}" if name else what, self.hint)

    @overload
    def get(self, key: str, kind: type[T]) -> T: ...
    @overload
    def get(self, key: str, kind: type[T], default: D) -> T | D: ...
    @overload
    def get(self, key: str, kind: tuple[type, ...], default: object = ...) -> object: ...

    def get(self, key: str, kind: type[T] | tuple[type, ...], default: object = ...) -> object:
        """The field's value when it is of kind (an int is taken for a float); default when it is missing or
        null and a default is given; a FileProblem naming the field otherwise."""
        if key not in self.data or (self.data[key] is None and default is not ...):
            if default is ...:
                raise self.problem("is missing", key)
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            raise self.problem(f"expected {kind_name(kind)}, found {found(value)}", key)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            raise self.problem(f"expected {kind_name(kind)}, found {found(value)}", key)
        if isinstance(value, float) and not math.isfinite(value):
            raise self.problem("is not a finite number", key)
        return value

    def strings(self, key: str, default: list[str] | EllipsisType = ...) -> list[str]:
        values = self.get(key, list) if isinstance(default, EllipsisType) else self.get(key, list, default)
        if any(not isinstance(v, str) for v in values):
            raise self.problem("expected a list of strings", key)
        return list(values)

    def child(self, key: str, default: dict[str, object] | EllipsisType = ...) -> Fields:
        return Fields(self.get(key, dict, default), self.path, self.hint, ".".join(p for p in (self.where, key) if p))

    def items(self, key: str) -> list[Fields]:
        return [Fields(v, self.path, self.hint, f"{self.where + '.' if self.where else ''}{key}[{i}]")
                for i, v in enumerate(self.get(key, list))]
