"""The validated spec as plain values (opsctl.spec.model) and the cache of validated specs (opsctl.state.speccache):
the plain classes are the pydantic models' twins, a warm cache gives the very spec a full validation gives, and
anything odd about an entry (damaged, foreign, stale, a link) means a full validation, never a wrong spec."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from opsctl.base.record import DataMismatch, Record
from opsctl.cli.main import main
from opsctl.spec import model, pydantic_model
from opsctl.spec.model import Spec
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec

SPECS = Path(__file__).parent / "specs"
EXAMPLES = Path(__file__).parents[1] / "examples"
GOOD = sorted((SPECS / "good").glob("*.yaml")) + sorted(EXAMPLES.glob("*.yaml"))
RECORDS = [cls for cls in vars(model).values() if isinstance(cls, type) and issubclass(cls, Record)
           and cls is not Record]


@pytest.mark.parametrize("record", RECORDS, ids=[cls.__name__ for cls in RECORDS])
def test_each_plain_class_has_the_pydantic_models_fields(record: type[Record]) -> None:
    validating = getattr(pydantic_model, record.__name__)
    assert list(model._fields_of(record)) == list(validating.model_fields)
    if record.DEFAULTS:  # a spec may leave these out: the plain defaults are the pydantic ones
        assert record().model_dump() == validating().model_dump(mode="json")


def test_every_model_has_a_plain_twin() -> None:
    models = {name for name, cls in vars(pydantic_model).items() if isinstance(cls, type)
              and issubclass(cls, pydantic_model.Strict) and cls is not pydantic_model.Strict}
    assert models == {cls.__name__ for cls in RECORDS}


@pytest.fixture(autouse=True)
def private_secret_files() -> None:
    for secret in SPECS.glob("*/secrets/*"):
        secret.chmod(0o600)


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_the_plain_spec_is_the_validated_one(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(path.parent)
    spec = read_spec(path.name, secrets=False, cached=False).spec
    assert spec.model_dump() == pydantic_model.Spec.model_validate(yaml.safe_load(path.read_text())).model_dump(
        mode="json")
    assert Spec.from_json(json.loads(json.dumps(spec.model_dump()))) == spec


@pytest.mark.parametrize("change", [
    lambda d: d.update(extra=1), lambda d: d.pop("lazyfree"), lambda d: d.update(lazyfree=1),
    lambda d: d["cluster"].update(masters=True), lambda d: d.update(topology="ring"),
    lambda d: d["hosts"][0].update(bind="127.0.0.1"), lambda d: d["config"].update(x=1.5),
    lambda d: d["auth"].update(password="plain"), lambda d: d.update(nodes={"a": None})],
    ids=["extra", "missing", "int-for-bool", "bool-for-int", "literal", "str-for-list", "float", "str-for-record",
         "null-record"])
def test_plain_values_are_read_strictly(change, tmp_path: Path) -> None:
    data = read_spec(write_spec(tmp_path, make_spec("cluster")), cached=False).spec.model_dump()
    change(data)
    with pytest.raises(DataMismatch):
        Spec.from_json(data)


def test_plain_values_are_frozen(tmp_path: Path) -> None:
    spec = read_spec(write_spec(tmp_path, make_spec("cluster")), cached=False).spec
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]
    assert spec.model_copy(update={"name": "other"}).name == "other" and spec.name != "other"


def cached_spec(tmp_path: Path, state: bool = True) -> Path:
    path = write_spec(tmp_path, make_spec("cluster"))
    if state:
        (tmp_path / ".opsctl").mkdir()
    return path


def entries(spec_path: Path) -> list[Path]:
    return sorted((spec_path.parent / ".opsctl" / "spec-cache").glob("*.json"))


def no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("validated in full")

    monkeypatch.setattr("opsctl.spec.validate.validated_spec", refuse)


def test_a_warm_cache_gives_the_same_spec_without_validating(tmp_path: Path, monkeypatch) -> None:
    spec_path = cached_spec(tmp_path)
    first = read_spec(spec_path)
    (entry,) = entries(spec_path)
    assert entry.stat().st_mode & 0o777 == 0o600
    assert PASSWORD not in entry.read_text() and PASSWORD_ENV in entry.read_text()  # the reference, not the value
    no_validation(monkeypatch)
    again = read_spec(spec_path)
    assert (again.spec, again.layout, again.file) == (first.spec, first.layout, first.file)
    assert again.credentials.password.reveal() == PASSWORD  # secrets are resolved anew on every run


def test_no_state_folder_no_cache(tmp_path: Path, capsys) -> None:
    spec_path = cached_spec(tmp_path, state=False)
    read_spec(spec_path)
    assert main(["validate", "-f", str(spec_path)]) == 0
    assert not (tmp_path / ".opsctl").exists()


def test_a_first_plan_beside_a_new_spec_warms_the_cache_for_the_apply_after_it(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    """plan keeps its state next to the spec (.opsctl): it makes that folder and keeps its validation there, so
    apply reads the spec back; with --state-dir elsewhere nothing is created beside the spec."""
    spec_path = cached_spec(tmp_path, state=False)
    assert main(["plan", "-f", str(spec_path), "--state-dir", str(tmp_path / "elsewhere")]) == 2
    assert not (tmp_path / ".opsctl").exists()
    assert main(["plan", "-f", str(spec_path)]) == 2
    assert len(entries(spec_path)) == 1
    no_validation(monkeypatch)
    assert main(["plan", "-f", str(spec_path)]) == 2


def test_without_secrets_nothing_is_stored(tmp_path: Path, monkeypatch, capsys) -> None:
    spec_path = cached_spec(tmp_path)
    monkeypatch.delenv(PASSWORD_ENV)
    assert main(["validate", "--no-secrets", "-f", str(spec_path)]) == 0
    assert not entries(spec_path)


def test_validate_always_validates_in_full(tmp_path: Path, monkeypatch, capsys) -> None:
    spec_path = cached_spec(tmp_path)
    read_spec(spec_path)
    with monkeypatch.context() as patched:
        no_validation(patched)
        assert main(["validate", "-f", str(spec_path)]) == 1
        assert "validated in full" in capsys.readouterr().err
    spec_path.write_text(spec_path.read_text() + "# edited\n")
    assert main(["validate", "-f", str(spec_path)]) == 0
    no_validation(monkeypatch)  # what validate stored serves the next plan
    assert read_spec(spec_path).spec.name


def test_a_changed_spec_misses(tmp_path: Path) -> None:
    spec_path = cached_spec(tmp_path)
    read_spec(spec_path)
    spec_path.write_text(spec_path.read_text().replace("maxmemory: 64mb", "maxmemory: 65mb"))
    assert read_spec(spec_path).spec.memory.maxmemory == "65mb"
    assert read_spec(spec_path).spec.memory.maxmemory == "65mb"  # and the entry now holds the new spec


def damage_text(text: str) -> str:
    return text[: len(text) // 2]


def damage_value(text: str) -> str:  # the digest no longer matches
    return text.replace('"maxmemory":"64mb"', '"maxmemory":"1gb"')


def damage_type(text: str) -> str:  # a wrong type under a digest that matches
    from opsctl.base.record import digest

    entry = json.loads(text)
    entry["spec"]["lazyfree"] = "yes"
    entry["digest"] = digest(entry["spec"])
    return json.dumps(entry)


def other_field(name: str, value: object):
    def change(text: str) -> str:
        return json.dumps({**json.loads(text), name: value})

    return change


@pytest.mark.parametrize("damage", [damage_text, damage_value, damage_type, other_field("format", 1),
                                    other_field("opsctl", "0.0.1"), other_field("key", "0" * 64),
                                    other_field("more", 1), lambda _: "[]", lambda _: "\xff"],
                         ids=["truncated", "value", "type", "format", "version", "key", "field", "list", "binary"])
def test_a_damaged_or_foreign_entry_means_a_full_validation(damage, tmp_path: Path, monkeypatch) -> None:
    spec_path = cached_spec(tmp_path)
    expected = read_spec(spec_path).spec
    (entry,) = entries(spec_path)
    entry.write_text(damage(entry.read_text()))
    calls = []
    from opsctl.spec import validate

    real = validate.validated_spec
    monkeypatch.setattr(validate, "validated_spec", lambda *a: calls.append(1) or real(*a))
    assert read_spec(spec_path).spec == expected
    assert calls == [1]
    assert read_spec(spec_path).spec == expected and calls == [1]  # rewritten: the next run hits


def test_a_link_is_never_read_nor_written_through(tmp_path: Path) -> None:
    spec_path = cached_spec(tmp_path)
    read_spec(spec_path)
    (entry,) = entries(spec_path)
    target = tmp_path / "elsewhere.json"
    target.write_text(entry.read_text().replace('"maxmemory":"64mb"', '"maxmemory":"1gb"'))
    entry.unlink()
    entry.symlink_to(target)
    assert read_spec(spec_path).spec.memory.maxmemory == "64mb"
    assert entry.is_symlink() and '"maxmemory":"1gb"' in target.read_text()  # left alone, never used


def test_a_linked_cache_folder_is_not_used(tmp_path: Path, monkeypatch) -> None:
    spec_path = cached_spec(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / ".opsctl" / "spec-cache").symlink_to(elsewhere)
    read_spec(spec_path)
    assert not list(elsewhere.iterdir())


def test_a_secret_problem_on_a_warm_cache_reads_as_always(tmp_path: Path, monkeypatch, capsys) -> None:
    spec_path = cached_spec(tmp_path)
    read_spec(spec_path)
    monkeypatch.setenv(PASSWORD_ENV, "short")
    code = main(["plan", "-f", str(spec_path)])
    cached_err = capsys.readouterr().err
    assert code == 1 and "too weak" in cached_err
    assert main(["validate", "-f", str(spec_path)]) == 1
    assert capsys.readouterr().err == cached_err
    monkeypatch.delenv(PASSWORD_ENV)
    assert main(["plan", "-f", str(spec_path)]) == 1
    assert f"environment variable {PASSWORD_ENV} is not set" in capsys.readouterr().err


def test_an_invalid_spec_is_never_stored(tmp_path: Path, capsys) -> None:
    spec_path = cached_spec(tmp_path)
    spec_path.write_text(spec_path.read_text().replace("topology: cluster", "topology: ring"))
    assert main(["plan", "-f", str(spec_path)]) == 1
    assert not entries(spec_path)
    assert os.path.isdir(tmp_path / ".opsctl")
