"""`opsctl schema` and `opsctl render` through the CLI, as a user runs them."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.cli.main import main
from tests.support import PASSWORD, make_spec, write_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = Path(__file__).parent / "specs"
GOOD = sorted((SPECS / "good").glob("*.yaml")) + sorted((ROOT / "examples").glob("*.yaml"))


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    from opsctl.spec.pydantic_model import spec_schema

    return spec_schema()


def test_schema_command_prints_the_schema(capsys: pytest.CaptureFixture[str], schema: dict[str, Any]) -> None:
    code, out, err = cli(["schema"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out) == schema
    assert schema["$schema"].endswith("2020-12/schema") and schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "topology", "hosts", "auth"}


def test_schema_is_valid_json_schema(schema: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("spec", GOOD, ids=[f"{p.parent.name}/{p.stem}" for p in GOOD])
def test_good_specs_and_examples_match_the_schema(spec: Path, schema: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(yaml.safe_load(spec.read_text())))
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize("name, field", [("unknown-field", "max_memory"), ("version-float", "9.1"),
                                         ("wrong-type-port-quoted", "7001"), ("unknown-flavor", "keydb")])
def test_schema_catches_what_an_editor_can(name: str, field: str, schema: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    data = yaml.safe_load((SPECS / "bad" / f"{name}.yaml").read_text())
    messages = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(data)]
    assert any(field in m for m in messages), messages


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    spec = make_spec("sentinel", "valkey", auth={"mode": "acl", "password": {"env": "OPSCTL_TEST_PASSWORD"}})
    return write_spec(tmp_path, spec)


def test_render_to_a_directory_writes_private_files_with_real_secrets(
        spec_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    code, out, err = cli(["render", "-f", str(spec_file), "--dir", str(out_dir)], capsys)
    assert code == 0 and err.startswith("note: no node of") and err.count("\n") == 1, err  # nothing deployed yet
    files = sorted(p for p in out_dir.rglob("*") if p.is_file())
    names = {f"{p.parent.name}/{p.name}" for p in files}
    assert len(files) == 3 * 2 + 3  # 3 servers: redis.conf + users.acl, 3 sentinels: sentinel.conf
    assert all(f"wrote {p}" in out for p in files)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), "secrets on disk are 0600"
    folders = [out_dir, *(p for p in out_dir.iterdir() if p.is_dir())]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in folders), "render folders are 0700"
    assert not list(out_dir.rglob(".*.tmp")), "no temporary files left"
    assert PASSWORD not in out, "the listing never shows a secret"
    for path in files:
        text = path.read_text()
        assert "***" not in text, f"{path}: a masked file would not start"
        if path.name in ("redis.conf", "sentinel.conf"):
            assert f'"{PASSWORD}"' in text and str(out_dir.resolve()) in text
    assert any(n.endswith("/users.acl") for n in names)


def test_render_to_stdout_is_masked(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["render", "-f", str(spec_file), "--dir", "-"], capsys)
    assert code == 0 and err.startswith("note: no node of") and err.count("\n") == 1, err  # nothing deployed yet
    assert PASSWORD not in out
    assert 'requirepass "***"' in out and "user opsctl on #*** " in out
    assert out.count("### ") == 9 and "/var/lib/opsctl/" in out


def test_render_to_stdout_shows_secrets_only_when_asked(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["render", "-f", str(spec_file), "--dir", "-", "--show-secrets"], capsys)
    assert code == 0 and f'"{PASSWORD}"' in out and "***" not in out


def test_render_of_a_bad_spec_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    code, out, err = cli(["render", "-f", str(SPECS / "bad" / "default-port.yaml"), "--dir", str(out_dir)], capsys)
    assert code == 1 and out == "" and "default port 6379" in err
    assert not out_dir.exists()
