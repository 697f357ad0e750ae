"""opsctl.base.frozen.@frozen behaves as @dataclass(frozen=True) does: the same repr, equality, hash, fields, asdict,
replace and refusals, for a fraction of the import cost."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, asdict, dataclass, field, fields, replace
from typing import ClassVar

import pytest

from opsctl.base.frozen import Frozen, frozen


@dataclass(frozen=True)
class Generated:
    kind: ClassVar[str] = "k"
    name: str
    count: int = 0
    tags: tuple[str, ...] = field(default=())
    extra: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    hidden: str = field(default="h", repr=False)


@frozen
class Made(Frozen):
    kind: ClassVar[str] = "k"
    name: str
    count: int = 0
    tags: tuple[str, ...] = field(default=())
    extra: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    hidden: str = field(default="h", repr=False)


@frozen
class Child(Made):
    more: bool = False


CALLS = [(("a",), {}), (("a", 2), {"tags": ("x",)}), ((), {"name": "b", "count": 3, "extra": {"e": 1}})]


@pytest.mark.parametrize("args, kwargs", CALLS)
def test_same_behaviour_as_a_frozen_dataclass(args, kwargs) -> None:
    generated, made = Generated(*args, **kwargs), Made(*args, **kwargs)
    assert repr(made) == repr(generated).replace("Generated", "Made")
    assert asdict(made) == asdict(generated)
    assert [f.name for f in fields(made)] == [f.name for f in fields(generated)]
    assert hash(made) == hash(generated)
    assert made == Made(*args, **kwargs) and made != Child(*args, **kwargs) and made != generated
    assert replace(made, count=9) == Made(**{**asdict(made), "count": 9})
    assert made.__match_args__ == generated.__match_args__
    with pytest.raises(FrozenInstanceError):
        made.name = "other"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        del made.name  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        made.anything = 1  # type: ignore[attr-defined]


def test_compare_false_is_left_out() -> None:
    assert Made("a", extra={"x": 1}) == Made("a", extra={"y": 2})
    assert Made("a") != Made("a", hidden="other")


def test_default_factories_give_each_instance_its_own() -> None:
    assert Made("a").extra is not Made("a").extra


@pytest.mark.parametrize("args, kwargs", [((), {}), (("a", 1, (), {}, "h", "more"), {}), (("a",), {"name": "b"}),
                                          (("a",), {"unknown": 1})])
def test_wrong_arguments_are_a_type_error(args, kwargs) -> None:
    with pytest.raises(TypeError):
        Made(*args, **kwargs)


def test_subclasses_add_fields() -> None:
    child = Child("a", more=True)
    assert (child.name, child.more) == ("a", True) and dataclasses.is_dataclass(child)
    assert repr(child) == "Child(name='a', count=0, tags=(), extra={}, more=True)"


def test_only_for_what_it_can_do() -> None:
    with pytest.raises(TypeError, match="must subclass"):
        frozen(type("Plain", (), {}))

    class Later(Frozen):
        value: int = field(init=False)

    with pytest.raises(TypeError, match="init=False"):
        frozen(Later)
