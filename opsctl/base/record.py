"""Frozen records declared once in a class body: each field's type (constraints as Annotated markers), default and
description. Record.from_json checks JSON-like data field by field for its types only; the markers and check() are
the validator's (opsctl.spec.pydantic_model). Nothing here imports pydantic: a spec validated before is read back
without it.

A short, stable digest of JSON-able data: plans, rendered files, specs and fingerprints are compared by it.

Times read back from stored records (manifests, archive descriptions, segments, leases, retention records) and
given on the command line (--to-time): finite, not before 1970, and not in the far future. Pure: the caller passes
now.

Numbers read back from files, keys and variables: ASCII digits in a range (ascii_decimal), the one check."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar, overload

T = TypeVar("T")
R = TypeVar("R", bound="Record")


class Range:
    """Marker: a whole number's bounds, both inclusive (None: no bound on that side)."""

    __slots__ = ("ge", "le")

    def __init__(self, ge: int | None = None, le: int | None = None) -> None:
        self.ge, self.le = ge, le


class Length:
    """Marker: the fewest characters of a string, or items of a list."""

    __slots__ = ("min",)

    def __init__(self, min: int) -> None:
        self.min = min


class Pattern:
    """Marker: a regular expression a string matches (anchor it to match the whole string)."""

    __slots__ = ("regex",)

    def __init__(self, regex: str) -> None:
        self.regex = regex


class Check:
    """Marker: a rule the validator implements under this name (opsctl.spec.pydantic_model.CHECKS), for a value it
    converts or words its own message for."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Hidden:
    """Marker: an error never quotes what this field holds. For a field that names where a secret lives (a file,
    say), where a mistake may put the secret itself; a field of a secret record's type (Record.SECRET) is one too."""

    __slots__ = ()


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # a field's default when it has none (Any: it stands in for a value of any type)


class RecordField:
    """One field of a record: its name and type (set when its class is made), its default (a value, or a factory
    making a fresh one for each record: a list, a mapping or a record) and what it means (the JSON Schema's
    description)."""

    __slots__ = ("default", "description", "factory", "kind", "name")

    def __init__(self, default: object = REQUIRED, factory: Callable[[], object] | None = None,
                 description: str | None = None) -> None:
        if isinstance(default, (list, dict, Record)):
            raise TypeError(f"a {type(default).__name__} default is shared by every record: use default_factory")
        self.name, self.kind = "", object()
        self.default, self.factory, self.description = default, factory, description

    @property
    def required(self) -> bool:
        return self.default is REQUIRED and self.factory is None

    def make_default(self) -> object:
        return self.factory() if self.factory is not None else self.default


@overload
def field(default: T, *, description: str | None = None) -> T: ...
@overload
def field(*, default_factory: Callable[[], T], description: str | None = None) -> T: ...
@overload
def field(*, description: str) -> Any: ...
def field(default: object = REQUIRED, *, default_factory: Callable[[], object] | None = None,
          description: str | None = None) -> Any:
    """A field's default and description beyond what `name: type = default` says (pydantic's Field, in short);
    field(description=...) alone: a required field's description. Any: the class body assigns it to a field of the
    declared type, which the record's instances hold instead."""
    return RecordField(default, default_factory, description)


class DataMismatch(ValueError):
    """JSON that does not have a record's shape: the field path and what was wrong."""


class Record:
    """A frozen value with typed fields, made from JSON-like data that is checked field by field (types only: the
    values' rules are the validator's). Method names follow pydantic's, so call sites read the same either way."""

    SECRET: ClassVar[bool] = False  # a field of this type names a secret: errors never quote what it holds
    # Every field's default, when the record may be left out whole (each field has one, and they pass check()).
    DEFAULTS: ClassVar[Mapping[str, object]] = {}
    _fields: ClassVar[dict[str, RecordField]] = {}  # in declaration order

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fields = _declared_fields(cls)
        cls.DEFAULTS = _whole_defaults(cls)

    def __init__(self, **values: object) -> None:
        fields = self._fields
        unknown = values.keys() - fields.keys()
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        missing = [name for name, f in fields.items() if f.required and name not in values]
        if missing:
            raise TypeError(f"{type(self).__name__} needs {', '.join(missing)}")
        self.__dict__.update({name: values[name] if name in values else f.make_default()
                              for name, f in fields.items()})

    def check(self) -> None:
        """The record's own rule across its fields: ValueError, worded for the user, when they break it. The
        validator runs it once the fields are valid; from_json does not (what it reads was validated)."""

    @classmethod
    def from_json(cls: type[R], data: object, where: str = "") -> R:
        """The record JSON data describes, every field present and of its type; DataMismatch otherwise."""
        if not isinstance(data, dict):
            raise DataMismatch(f"{where or cls.__name__}: a mapping expected, got {type(data).__name__}")
        fields = cls._fields
        if data.keys() != fields.keys():
            raise DataMismatch(f"{where or cls.__name__}: fields {sorted(data)} are not {sorted(fields)}")
        return cls(**{name: _read(f.kind, data[name], f"{where}.{name}" if where else name)
                      for name, f in fields.items()})

    def model_dump(self, mode: Literal["json"] = "json") -> dict[str, Any]:
        """The JSON form (what from_json reads back): pydantic's model_dump(mode="json") of the same spec."""
        return {name: _dump(value) for name, value in self.__dict__.items()}

    def model_copy(self: R, update: Mapping[str, object] | None = None) -> R:
        """A copy with some fields replaced (not checked, as pydantic's)."""
        return type(self)(**{**self.__dict__, **(update or {})})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    def __hash__(self) -> int:
        return hash((type(self), *self.__dict__.values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


def fields_of(cls: type[Record]) -> dict[str, RecordField]:
    """The record's fields, in declaration order."""
    return cls._fields


def _declared_fields(cls: type[Record]) -> dict[str, RecordField]:
    """The fields a class body declares: its own annotations (kept as types: this module and the records' have no
    `from __future__ import annotations`), each with the default or field() after it, which the class then drops
    (an instance holds every field's value itself)."""
    fields: dict[str, RecordField] = {}
    for name, kind in inspect.get_annotations(cls).items():
        origin: object = typing.get_origin(kind)
        if origin is ClassVar:
            continue
        declared = cls.__dict__.get(name, REQUIRED)
        made = declared if isinstance(declared, RecordField) else RecordField(declared)
        made.name, made.kind = name, kind
        fields[name] = made
        if name in cls.__dict__:
            delattr(cls, name)
    return fields


def _whole_defaults(cls: type[Record]) -> Mapping[str, object]:
    if any(f.required for f in cls._fields.values()):
        return {}
    record = cls()
    try:
        record.check()
    except ValueError:
        return {}
    return dict(record.__dict__)


def _read(kind: object, value: object, where: str) -> object:
    """value checked against kind (str, int, bool, None, Literal, unions, list[X], dict[str, X], a Record,
    Annotated: its markers are the validator's)."""
    origin = typing.get_origin(kind)
    if origin is Annotated:
        return _read(typing.get_args(kind)[0], value, where)
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_json(value, where)
    if kind in (str, int, bool):
        if type(value) is not kind:  # strict: True is no int, 1 no bool
            raise DataMismatch(f"{where}: {kind.__name__} expected, got {type(value).__name__}")
        return value
    if kind is type(None):
        if value is not None:
            raise DataMismatch(f"{where}: null expected, got {type(value).__name__}")
        return None
    if origin is Literal:
        if value not in typing.get_args(kind) or type(value) is not str:
            raise DataMismatch(f"{where}: one of {typing.get_args(kind)} expected")
        return value
    if origin in (types.UnionType, typing.Union):
        for option in typing.get_args(kind):
            try:
                return _read(option, value, where)
            except DataMismatch:
                continue
        raise DataMismatch(f"{where}: {kind} expected, got {type(value).__name__}")
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(kind)
        return [_read(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and isinstance(value, dict):
        _, item = typing.get_args(kind)
        return {_read(str, k, where): _read(item, v, f"{where}.{k}") for k, v in value.items()}
    raise DataMismatch(f"{where}: {kind} expected, got {type(value).__name__}")


def _dump(value: object) -> object:
    if isinstance(value, Record):
        return value.model_dump()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


FLOOR = 0.0  # 1970-01-01T00:00:00Z: a time before is no clock's
AHEAD = 86400.0  # s a stored time may lie ahead of this clock (written on a host whose clock runs ahead)


def stored_time(value: object, now: float) -> float | None:
    """value as a unix time when it is a number (not a bool) from FLOOR to now + AHEAD; None otherwise (NaN,
    1e308, negative, a string, a date in 9999)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    moment = float(value)
    return moment if math.isfinite(moment) and FLOOR <= moment <= now + AHEAD else None


def stored_iso(text: str, now: float) -> float | None:
    """An ISO 8601 time with a zone as a unix time, checked as stored_time; None when it is not one."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    try:
        return stored_time(moment.timestamp(), now)
    except (OverflowError, OSError, ValueError):
        return None


def ascii_decimal(text: object, low: int, high: int) -> int | None:
    """text's number when it is written in ASCII digits alone and low <= it <= high, else None. The one check of a
    number read from a file, a key or a variable: str.isdigit() takes '²' (int() then raises) and '٣' (int() reads
    3), int() takes ' 3' and '+3'."""
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= len(str(high))):
        return None
    value = int(text)
    return value if low <= value <= high else None
