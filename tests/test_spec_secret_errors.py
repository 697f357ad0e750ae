"""A secret written inline at a secret place is refused without being quoted back (issue 25, defect 1): the places
are found by walking the declared types of opsctl.spec.model, so a secret field added later is covered too."""

from __future__ import annotations

import copy
import itertools
import typing
from typing import Annotated, Any

import pytest
import yaml

from opsctl.base.errors import SpecError
from opsctl.base.record import Hidden, Record, fields_of
from opsctl.spec import model
from opsctl.spec.validate import validated_spec
from opsctl.spec.yamlpos import field_path

SECRET = "hunter2-do-not-print-7f3a9c"
NODE = "orders-1"
BASE: dict[str, Any] = {"name": "orders", "topology": "standalone",
                        "hosts": [{"name": "h1", "address": "127.0.0.2"}],
                        "auth": {"password": {"env": "ORDERS_REDIS_PASSWORD"}}}
Path = tuple[str | int, ...]


def _names_secret(kind: object) -> bool:
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.SECRET
    if typing.get_origin(kind) is Annotated:
        args = typing.get_args(kind)
        return any(isinstance(m, Hidden) for m in args[1:]) or _names_secret(args[0])
    return typing.get_origin(kind) is not typing.Literal and any(_names_secret(a) for a in typing.get_args(kind))


def _inner(kind: object) -> list[tuple[tuple[str | int, ...], type[Record]]]:
    """The records a field's type holds, each with the parts (list index, mapping key) that lead to it."""
    if isinstance(kind, type) and issubclass(kind, Record):
        return [((), kind)]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        return _inner(args[0])
    if origin is list:
        return [((0, *p), r) for p, r in _inner(args[0])]
    if origin is dict:
        return [((NODE, *p), r) for p, r in _inner(args[1])]
    return [found for arg in args if origin is not typing.Literal for found in _inner(arg)]


def secret_places(record: type[Record] = model.Spec, at: Path = ()) -> list[tuple[Path, type[Record]]]:
    """Every field of the spec whose declared type names a secret, with the record written there."""
    places: list[tuple[Path, type[Record]]] = []
    for name, declared in fields_of(record).items():
        path = (*at, name)
        if _names_secret(declared.kind):
            places += [((*path, *parts), inner) for parts, inner in _inner(declared.kind)]
            continue
        for parts, inner in _inner(declared.kind):
            places += secret_places(inner, (*path, *parts))
    return places


PLACES = secret_places()


def _put(data: dict[str, Any], path: Path, value: object) -> dict[str, Any]:
    """data with value at path, making the lists and mappings on the way."""
    data = copy.deepcopy(data)
    here: Any = data
    for part, after in itertools.pairwise(path):
        empty: Any = [{}] if isinstance(after, int) else {}
        here = here[part] if isinstance(part, int) else here.setdefault(part, empty)
    here[path[-1]] = value
    return data


def _errors(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as caught:
        validated_spec(yaml.safe_dump(data), "spec.yaml", None)
    return caught.value


def test_the_walk_finds_the_known_secret_fields() -> None:
    found = {field_path(path) for path, _ in PLACES}
    assert {"auth.password", "auth.previous_password", "auth.users[0].password", "auth.users[0].previous_password",
            "hardening.rename_key", "tls.key", "hosts[0].tls.key", f"nodes.{NODE}.tls.key"} <= found


def _shapes(record: type[Record]) -> list[object]:
    """Wrong ways to write a secret place with the secret itself: inline, in a list, as a key, in a field."""
    return [SECRET, [SECRET], {SECRET: None}, *({name: [SECRET]} for name in fields_of(record))]


@pytest.mark.parametrize(("path", "record"), PLACES, ids=[field_path(p) for p, _ in PLACES])
def test_a_secret_written_inline_is_refused_without_being_quoted(path: Path, record: type[Record]) -> None:
    for shape in _shapes(record):
        error = _errors(_put(BASE, path, shape))
        text = error.render()
        assert SECRET not in text, f"{shape!r} at {field_path(path)} is quoted back:\n{text}"
        assert any(p.field.startswith(field_path(path)) for p in error.problems), text


@pytest.mark.parametrize(("path", "record"), PLACES, ids=[field_path(p) for p, _ in PLACES])
def test_the_hint_says_how_the_secret_is_given(path: Path, record: type[Record]) -> None:
    error = _errors(_put(BASE, path, SECRET))
    (problem,) = [p for p in error.problems if p.field == field_path(path)]
    forms = {"env": "{env: VAR}", "file": "{file: PATH}"}
    assert all(forms[name] in problem.hint for name in fields_of(record)), problem


@pytest.mark.parametrize("directive", sorted(model.SECRET_CONFIG))
@pytest.mark.parametrize("where", [("config",), ("nodes", NODE, "config")])
def test_a_secret_directive_in_config_is_not_quoted(directive: str, where: Path) -> None:
    text = _errors(_put(BASE, (*where, directive), [SECRET])).render()
    assert SECRET not in text and f"{field_path((*where, directive))}: " in text


def test_other_values_are_still_quoted() -> None:
    text = _errors(_put(BASE, ("config", "hz"), ["banana"])).render()
    assert "got ['banana']" in text


@pytest.mark.parametrize("path", [p for p, record in PLACES if "env" in fields_of(record)],
                         ids=[field_path(p) for p, record in PLACES if "env" in fields_of(record)])
def test_a_secret_pasted_as_the_variable_name_is_not_quoted(path: Path) -> None:
    """{env: <the secret>}: not a variable's name, refused before anyone looks the variable up (and names it)."""
    with pytest.raises(SpecError) as caught:
        validated_spec(yaml.safe_dump(_put(BASE, path, {"env": SECRET})), "spec.yaml", lambda ref: None)
    text = caught.value.render()
    assert SECRET not in text and f"{field_path(path)}.env: " in text, text
