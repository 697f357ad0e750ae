"""Frozen records declared once in a class body: each field's type (constraints as Annotated markers), default and
description. Record.from_json checks JSON-like data field by field for its types only; the markers and check() are
the validator's (opsctl.spec.pydantic_model). Nothing here imports pydantic: a spec validated before is read back
without it.

Saved formats (Versioned): files opsctl writes and reads back (node records, segment headers, leases, journals) as
@frozen records whose type hints are the schema, read field by field by one checker (_read, which Record.from_json
shares), with a format number and an upgrade step.

A short, stable digest of JSON-able data: plans, rendered files, specs and fingerprints are compared by it.

Times read back from stored records (manifests, archive descriptions, segments, leases, retention records) and
given on the command line (--to-time): finite, not before 1970, and not in the far future. Pure: the caller passes
now.

Numbers read back from files, keys and variables: ASCII digits in a range (ascii_decimal), the one check."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar, overload

from opsctl.base.frozen import Frozen

T = TypeVar("T")
R = TypeVar("R", bound="Record")


class Range:
    """Marker: a whole number's bounds, both inclusive (None: no bound on that side); what: the number's name in a
    saved format's error ("a port": "is not a port from 1 to 65535")."""

    __slots__ = ("ge", "le", "what")

    def __init__(self, ge: int | None = None, le: int | None = None, what: str = "") -> None:
        self.ge, self.le, self.what = ge, le, what


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
    """value checked against kind (str, int, float, bool, None, Literal, unions, list[X], tuple[X, ...], tuple[X, Y],
    dict[str, X] and Mapping[str, X], a Record, a @frozen record; Annotated: its Range markers, the others are the
    validator's). Errors name where and what was found, never the value (it may be a secret)."""
    origin = typing.get_origin(kind)
    if origin is Annotated:
        inner, *markers = typing.get_args(kind)
        read = _read(inner, value, where)
        for marker in markers:
            if isinstance(marker, Range) and isinstance(read, int) and not _in_range(read, marker):
                raise DataMismatch(_at(where, f"is not {marker.what + ' ' if marker.what else ''}from "
                                              f"{marker.ge} to {marker.le}"))
        return read
    if kind is object:  # any JSON value: its reader checks it (a saved plan's steps, by their kind)
        return value
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_json(value, where)
    if isinstance(kind, type) and issubclass(kind, Frozen):
        return read_fields(kind, value, where)
    if kind in (str, int, bool, float):
        return _scalar(typing.cast(type, kind), value, where)
    if kind is type(None):
        if value is not None:
            raise DataMismatch(_at(where, f"expected null, found {found(value)}"))
        return None
    if origin is Literal:
        if value not in typing.get_args(kind) or type(value) is not str:
            raise DataMismatch(_at(where, f"expected one of {', '.join(map(str, typing.get_args(kind)))}"))
        return value
    if origin in (types.UnionType, typing.Union):
        options = [o for o in typing.get_args(kind) if value is None or o is not type(None)]
        if len(options) == 1:  # X | None holding a value: X's own error names the field inside it
            return _read(options[0], value, where)
        for option in options:
            try:
                return _read(option, value, where)
            except DataMismatch:
                continue
        raise DataMismatch(_at(where, f"expected {_kind_words(kind)}, found {found(value)}"))
    if origin in (list, tuple) and isinstance(value, list):
        return _items(origin, typing.get_args(kind), value, where)
    if origin in (dict, Mapping) and isinstance(value, dict):
        _, item = typing.get_args(kind)
        return {_read(str, k, where): _read(item, v, f"{where}.{k}") for k, v in value.items()}
    raise DataMismatch(_at(where, f"expected {_kind_words(kind)}, found {found(value)}"))


def _scalar(kind: type, value: object, where: str) -> object:
    """strict: True is no int and 1 no bool; an int is taken for a float, which must be finite."""
    if kind is float and type(value) is int:
        value = float(value)
    if type(value) is not kind:
        raise DataMismatch(_at(where, f"expected {kind_name(kind)}, found {found(value)}"))
    if isinstance(value, float) and not math.isfinite(value):
        raise DataMismatch(_at(where, "is not a finite number"))
    return value


def _items(origin: object, args: tuple[object, ...], value: list[object], where: str) -> object:
    """A JSON list as list[X], tuple[X, ...] or tuple[X, Y, ...] (as many items as the tuple has types)."""
    if origin is list or (len(args) == 2 and args[1] is Ellipsis):
        items = [_read(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if len(value) != len(args):
        raise DataMismatch(_at(where, f"expected a list of {len(args)} items, found {len(value)}"))
    return tuple(_read(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))


def _in_range(value: int, bounds: Range) -> bool:
    return (bounds.ge is None or value >= bounds.ge) and (bounds.le is None or value <= bounds.le)


def _at(where: str, what: str) -> str:
    return f"{where}: {what}" if where else what


def _kind_words(kind: object) -> str:
    """A type in a reader's words: "a whole number or null", "a list", "an object"."""
    origin = typing.get_origin(kind)
    if origin is Annotated:
        return _kind_words(typing.get_args(kind)[0])
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_kind_words(option) for option in typing.get_args(kind))
    if kind is type(None):
        return "null"
    if origin in (list, tuple):
        return "a list"
    if origin in (dict, Mapping) or (isinstance(kind, type) and issubclass(kind, (Record, Frozen))):
        return "an object"
    return kind_name(kind) if isinstance(kind, type) else str(kind)


def _dump(value: object) -> object:
    if isinstance(value, Record):
        return value.model_dump()
    if isinstance(value, Versioned):
        return value.to_json()
    if isinstance(value, Frozen):
        return {f.name: _dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _dump(v) for k, v in value.items()}
    return value


KIND_NAMES: dict[type, str] = {str: "a string", int: "a whole number", float: "a number", bool: "true or false",
                               list: "a list", dict: "an object"}


def kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(KIND_NAMES.get(k, k.__name__) for k in kinds)


def found(value: object) -> str:
    """What a JSON value is, never what it holds (it may be a secret)."""
    if value is None:
        return "null"
    return KIND_NAMES.get(type(value), type(value).__name__).removeprefix("a ").removeprefix("an ")


F = TypeVar("F", bound=Frozen)
V = TypeVar("V", bound="Versioned")
KEPT = "kept"  # the field of a record that keeps the keys it does not know, to write them back as they were


_HINTS: dict[type, dict[str, object]] = {}


def _hints(cls: type) -> dict[str, object]:
    """A @frozen class's field types, resolved once (its module imports them at run time: they are checked)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def read_fields(cls: type[F], data: object, where: str = "") -> F:
    """A @frozen record from a JSON object, each field checked against its type hint (_read): a missing field takes
    its default (a required one is a DataMismatch), null too where the type takes no null (as the readers did
    before); a key the class does not know is refused, or kept in its `kept` field when it has one."""
    if not isinstance(data, dict):
        raise DataMismatch(_at(where, f"expected an object, found {found(data)}"))
    hints, values = _hints(cls), {}
    declared = {f.name: f for f in dataclasses.fields(cls)}
    for name, spot in declared.items():
        path = f"{where}.{name}" if where else name
        has_default = spot.default is not dataclasses.MISSING or spot.default_factory is not dataclasses.MISSING
        if name == KEPT:
            continue
        if name not in data or (data[name] is None and has_default and not _takes_null(hints[name])):
            if not has_default:
                raise DataMismatch(_at(path, "is missing"))
            continue
        values[name] = _read(hints[name], data[name], path)
    unknown = {k: v for k, v in data.items() if k not in declared}
    if unknown and issubclass(cls, Versioned) and cls.READS_PART:
        unknown = {}
    if unknown and KEPT not in declared:
        raise DataMismatch(_at(where, f"unknown field {_quoted(next(iter(unknown)))}"))
    if unknown:
        values[KEPT] = unknown
    record = cls(**values)
    for name, what in record.problems() if isinstance(record, Versioned) else ():
        raise DataMismatch(_at(f"{where}.{name}" if where else name, what))
    return record


def _takes_null(kind: object) -> bool:
    return kind is type(None) or (typing.get_origin(kind) in (types.UnionType, typing.Union)
                                  and type(None) in typing.get_args(kind))


def _quoted(key: str) -> str:
    """A key read from a file, shown to name it: short, printable (a key is a name, never where a secret goes)."""
    return repr(key[:40])


class Versioned(Frozen):
    """A saved format (a file opsctl writes and reads back): a @frozen record whose field types are its schema, and
    its version. from_json checks every field by its type hint (read_fields), to_json is the JSON it reads back.
    A file without `format` reads as format 1; format 1 is written without it (files written before stay byte for
    byte); a later format names itself, and upgraded() turns an older file's data into the current shape."""

    format: ClassVar[int] = 1
    SPARSE: ClassVar[bool] = False  # a field at its default is left out of the JSON (a missing key reads as it)
    READS_PART: ClassVar[bool] = False  # a reader's view of a bigger file: the keys it does not declare are passed

    @classmethod
    def from_json(cls: type[V], data: object, where: str = "") -> V:
        written = data.get("format", 1) if isinstance(data, dict) else 1
        if type(written) is not int or not 1 <= written <= cls.format:
            raise DataMismatch(_at(f"{where}.format" if where else "format", f"is not a format from 1 to "
                                   f"{cls.format}: written by another opsctl (or not by opsctl)"))
        if isinstance(data, dict):
            data = cls.upgraded({k: v for k, v in data.items() if k != "format"}, written)
        return read_fields(cls, data, where)

    @classmethod
    def upgraded(cls, data: dict[str, object], written: int) -> dict[str, object]:
        """The data of a file of an older format in this format's shape (format 1 has none older)."""
        return data

    def problems(self) -> Iterator[tuple[str, str]]:
        """(field, what is wrong) for each value its type allows that the format does not (an address that is
        none): read_fields refuses the record on the first."""
        return iter(())

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {} if self.format == 1 else {"format": self.format}
        kept: Mapping[str, object] = {}
        for spot in dataclasses.fields(self):
            value = getattr(self, spot.name)
            if spot.name == KEPT:
                kept = value or {}
            elif not (self.SPARSE and _at_default(spot, value)):
                out[spot.name] = _dump(value)
        return {**kept, **out}


def _at_default(spot: dataclasses.Field[object], value: object) -> bool:
    if spot.default is not dataclasses.MISSING:
        return bool(value == spot.default)
    return spot.default_factory is not dataclasses.MISSING and bool(value == spot.default_factory())


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
