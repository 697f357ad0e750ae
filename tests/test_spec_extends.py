"""`extends: PATH` (opsctl.spec.extends): merge rules, chains, located cycles and missing bases, the origin of every
error, `render --show-origins`, and the spec cache's skipping of specs that extend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.base.errors import SpecError
from opsctl.cli.main import main
from opsctl.spec.extends import chain_of, merged_document
from opsctl.spec.secretrefs import HIDDEN
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD_ENV

BASE = f"""\
server: {{flavor: valkey, version: "9.1"}}
hosts:
  - {{name: h1, address: 127.0.0.1}}
  - {{name: h2, address: 127.0.0.2}}
auth:
  mode: password
  password: {{env: {PASSWORD_ENV}}}
hardening:
  renamed_commands: {{CONFIG: OPS_CONFIG_T3ST}}
memory:
  maxmemory: 64mb
  policy: allkeys-lru
"""

SPEC = """\
extends: bases/prod.yaml
name: sessions
topology: standalone
standalone: {host: h1, port: 17001}
memory:
  policy: noeviction
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / next(iter(files))


def problems_of(path: Path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        read_spec(path, cached=False)
    return [p.render() for p in caught.value.problems]


def test_maps_merge_key_by_key_and_the_spec_wins(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE})
    loaded = read_spec(spec, cached=False)
    assert loaded.spec.memory.policy == "noeviction"  # the spec's value
    assert loaded.spec.memory.maxmemory == "64mb"  # the base's sibling kept
    assert [h.name for h in loaded.spec.hosts] == ["h1", "h2"]


def test_lists_and_scalars_replace_whole(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC + "hosts:\n  - {name: h1, address: 127.0.0.3}\n",
                            "bases/prod.yaml": BASE})
    loaded = read_spec(spec, cached=False)
    assert [(h.name, h.address) for h in loaded.spec.hosts] == [("h1", "127.0.0.3")]


def test_a_chain_of_bases_merges_in_order(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC.replace("bases/prod.yaml", "bases/eu.yaml"),
                            "bases/eu.yaml": "extends: prod.yaml\nmemory: {maxmemory: 32mb}\n",
                            "bases/prod.yaml": BASE})
    loaded = read_spec(spec, cached=False)
    assert (loaded.spec.memory.maxmemory, loaded.spec.memory.policy) == ("32mb", "noeviction")
    doc, _ = merged_document(spec.read_text(), str(spec))
    assert doc is not None
    assert [Path(f).name for f in chain_of(doc)] == ["a.yaml", "eu.yaml", "prod.yaml"]


def test_an_error_in_a_value_from_the_base_names_the_base_file_and_line(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE.replace("64mb", "12x")})
    (problem,) = problems_of(spec)
    assert problem.startswith(f"{tmp_path / 'bases/prod.yaml'}:11: memory.maxmemory: '12x' is not valid")
    with pytest.raises(SpecError) as caught:
        read_spec(spec, cached=False)
    assert caught.value.summary == f"{spec}: 1 problem in the spec"  # the spec run, its base's line below


def test_an_error_in_the_spec_names_the_spec(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC.replace("noeviction", "nope"), "bases/prod.yaml": BASE})
    assert any(p.startswith(f"{spec}:6: memory.policy") for p in problems_of(spec))


def test_a_cross_check_names_the_file_of_the_value_at_fault(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC.replace("host: h1", "host: h9"), "bases/prod.yaml": BASE})
    assert any(p.startswith(f"{spec}:4: standalone.host") for p in problems_of(spec))
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE.replace("h2,", "h1,")})
    assert any(p.startswith(f"{tmp_path / 'bases/prod.yaml'}:4: hosts[1]") for p in problems_of(spec))


def test_a_missing_base_is_located_at_the_extends_line(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": "# the base is not there\n" + SPEC})
    (problem,) = problems_of(spec)
    assert problem.startswith(f"{spec}:2: extends: the base spec {tmp_path / 'bases/prod.yaml'} does not exist")


def test_a_cycle_is_located_and_named(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": "memory: {}\nextends: ../a.yaml\n"})
    (problem,) = problems_of(spec)
    assert problem.startswith(f"{tmp_path / 'bases/prod.yaml'}:2: extends: extends makes a cycle: ")
    assert "a.yaml -> " in problem and problem.count("a.yaml") == 2


def test_extends_must_be_a_path(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": "extends: [x]\nname: x\n"})
    (problem,) = problems_of(spec)
    assert problem.startswith(f"{spec}:1: extends: must be the path of a base spec")


def test_a_syntax_error_in_the_base_names_the_base(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": "memory: [\n"})
    (problem,) = problems_of(spec)
    assert problem.startswith(str(tmp_path / "bases/prod.yaml"))


def test_render_show_origins_names_each_value_s_file_and_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE})
    assert main(["render", "-f", str(spec), "--dir", "-", "--show-origins"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"memory.policy: 'noeviction'  # {spec}:6" in out
    assert f"memory.maxmemory: '64mb'  # {tmp_path / 'bases/prod.yaml'}:11" in out
    assert f"hosts[1].address: '127.0.0.2'  # {tmp_path / 'bases/prod.yaml'}:4" in out
    assert not any(PASSWORD_ENV in line for line in out)  # a secret place's value is not shown


def test_render_show_origins_prints_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE})
    assert main(["render", "-f", str(spec), "--dir", str(tmp_path / "out"), "--show-origins"]) == 1
    assert "--dir -" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_spec_that_extends_is_not_cached(tmp_path: Path) -> None:
    """The cache keys on the spec's bytes: a base's edit must not be hidden by it."""
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE})
    (tmp_path / ".opsctl").mkdir()
    assert read_spec(spec).spec.memory.maxmemory == "64mb"
    (tmp_path / "bases/prod.yaml").write_text(BASE.replace("64mb", "32mb"))
    assert read_spec(spec).spec.memory.maxmemory == "32mb"
    assert not (tmp_path / ".opsctl" / "spec-cache").exists()


def test_the_spec_s_own_problems_come_first_then_the_base_s(tmp_path: Path) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC.replace("noeviction", "nope"),
                            "bases/prod.yaml": BASE.replace("64mb", "12x")})
    with pytest.raises(SpecError) as caught:
        read_spec(spec, cached=False)
    assert [Path(p.file).name for p in caught.value.problems] == ["a.yaml", "prod.yaml"]
    assert caught.value.summary.startswith(f"{spec}: 2 problems")


def test_plan_json_show_origins_adds_the_merged_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "a-real-secret-4f1d")
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE})
    code = main(["plan", "-f", str(spec), "--output", "json", "--show-origins", "--state-dir", str(tmp_path / "st")])
    out = capsys.readouterr().out
    assert code == 2  # nothing deployed: the plan creates the node
    plan = json.loads(out)
    assert plan["steps"]  # the plan as without the flag, the merged spec beside it
    origins = {entry["field"]: entry for entry in plan["spec_origins"]}
    assert origins["memory.policy"] == {"field": "memory.policy", "value": "noeviction", "origin": f"{spec}:6"}
    assert origins["memory.maxmemory"]["origin"] == f"{tmp_path / 'bases/prod.yaml'}:11"
    assert origins["standalone.port"]["value"] == 17001  # a value as JSON has it, not quoted
    assert origins["auth.password.env"]["value"] == HIDDEN and PASSWORD_ENV not in out  # never a secret place's value
    assert "a-real-secret-4f1d" not in out


def test_plan_show_origins_goes_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, {"a.yaml": SPEC, "bases/prod.yaml": BASE})
    assert main(["plan", "-f", str(spec), "--show-origins"]) == 1
    err = capsys.readouterr().err
    assert "goes with --output json" in err and f"opsctl render -f {spec} --dir - --show-origins" in err
