"""Frozen value classes (@frozen) at a fraction of the import cost of @dataclass(frozen=True).

A @frozen class is a dataclass (fields(), asdict(), replace() work), but its __init__, __repr__, __eq__, __hash__,
__setattr__ and __delattr__ are Frozen's, written once and reading the class's fields: same repr, equality and hash,
no attribute can be set. Why: dataclass compiles six methods per class."""

from __future__ import annotations

import sys
from dataclasses import MISSING, Field, FrozenInstanceError, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

if sys.version_info >= (3, 11):
    from typing import dataclass_transform  # novermin (guarded: 3.11+)
else:  # Python 3.10: the backport (a dependency there), so type checkers see @frozen classes as dataclasses
    from typing_extensions import dataclass_transform

T = TypeVar("T")


class Frozen:
    """The base of @frozen classes: their methods, given the fields @frozen listed in _frozen_fields."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    _frozen_fields: ClassVar[tuple[tuple[str, Any, Any], ...]]  # (name, default, default factory), in order
    _compared: ClassVar[tuple[str, ...]]  # the fields __eq__ compares (field(compare=False) leaves one out)
    _hashed: ClassVar[tuple[str, ...]]  # and __hash__ hashes (field(hash=...), else as compared)
    _shown: ClassVar[tuple[str, ...]]  # and __repr__ shows (field(repr=False) hides one)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        spec = type(self)._frozen_fields
        if len(args) > len(spec):
            raise TypeError(f"{type(self).__name__}() takes {len(spec)} arguments, {len(args)} given")
        values = dict(zip([name for name, _, _ in spec], args, strict=False))  # args may be fewer
        for name, value in kwargs.items():
            if name in values or not any(name == known for known, _, _ in spec):
                raise TypeError(f"{type(self).__name__}() got {'twice' if name in values else 'an unknown'} "
                                f"argument {name!r}")
            values[name] = value
        for name, default, factory in spec:
            if name in values:
                value = values[name]
            elif default is not MISSING:
                value = default
            elif factory is not MISSING:
                value = factory()
            else:
                raise TypeError(f"{type(self).__name__}() is missing the argument {name!r}")
            object.__setattr__(self, name, value)

    def _values(self, names: tuple[str, ...]) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in names)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values(self._compared) == other._values(self._compared)

    def __hash__(self) -> int:
        return hash(self._values(self._hashed))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._shown)
        return f"{type(self).__qualname__}({shown})"

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def frozen(cls: type[T]) -> type[T]:
    """@dataclass(frozen=True) for a subclass of Frozen, without generated methods."""
    if not issubclass(cls, Frozen):
        raise TypeError(f"@frozen: {cls.__name__} must subclass opsctl.base.frozen.Frozen")
    made = dataclass(init=False, repr=False, eq=False)(cls)
    listed = fields(made)
    if any(not f.init for f in listed) or hasattr(made, "__post_init__"):
        raise TypeError(f"@frozen: {cls.__name__} needs field(init=False) or __post_init__: use @dataclass")
    made._frozen_fields = tuple((f.name, f.default, f.default_factory) for f in listed)
    made._compared = tuple(f.name for f in listed if f.compare)
    made._hashed = tuple(f.name for f in listed if (f.compare if f.hash is None else f.hash))
    made._shown = tuple(f.name for f in listed if f.repr)
    return made
