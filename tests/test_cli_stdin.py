"""`-f -` reads the spec from standard input (issue 25, convention 8). Such a spec has no folder: its relative paths
start at the working directory, a command that keeps state needs --state-dir (refused before anything is read or
written), and nothing is cached anywhere."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import yaml

from opsctl.base.errors import OpsctlError
from opsctl.cli.main import main
from opsctl.state import specfile
from tests.support import PASSWORD, PASSWORD_ENV, make_spec


def feed(monkeypatch: pytest.MonkeyPatch, text: str | bytes) -> None:
    """Standard input holding text, as a pipe gives it."""
    data = text if isinstance(text, bytes) else text.encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    monkeypatch.setattr(specfile, "_stdin_read", [])


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_reads_the_spec_from_stdin(cwd: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_spec("replication")
    feed(monkeypatch, yaml.safe_dump(spec))
    code, out, err = run(capsys, "validate", "-f", "-", "--output", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["file"] == "<stdin>" and result["name"] == spec["name"] and len(result["nodes"]) == 3
    assert os.listdir(cwd) == []  # no spec cache, no .opsctl


def test_relative_secret_files_start_at_the_working_directory(cwd: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (cwd / "secrets").mkdir()
    secret = cwd / "secrets" / "pw"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    spec = make_spec("standalone", auth={"mode": "password", "password": {"file": "secrets/pw"}})
    feed(monkeypatch, yaml.safe_dump(spec))
    code, out, err = run(capsys, "validate", "-f", "-")
    assert code == 0, err
    assert out.startswith(f"<stdin>: valid standalone spec '{spec['name']}'")
    monkeypatch.chdir(cwd / "secrets")  # elsewhere, the same relative path names no file
    feed(monkeypatch, yaml.safe_dump(spec))
    code, _, err = run(capsys, "validate", "-f", "-")
    assert code == 1 and "secret not found" in err, err


@pytest.mark.parametrize("argv", [["status"], ["plan"], ["apply", "--auto-approve"], ["destroy", "--dry-run"],
                                  ["cluster", "check"], ["tls", "ca"]])
def test_a_command_with_state_needs_state_dir(argv: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    feed(monkeypatch, yaml.safe_dump(make_spec("cluster")))
    code, out, err = run(capsys, *argv, "-f", "-")
    assert code == 1 and not out
    assert "error: -f - needs --state-dir" in err and "working directory" in err and "Traceback" not in err
    assert os.listdir(cwd) == []
    assert not specfile._stdin_read  # refused before standard input was read


def test_plan_with_state_dir_plans_from_stdin(cwd: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_spec("standalone")
    feed(monkeypatch, yaml.safe_dump(spec))
    code, out, err = run(capsys, "plan", "-f", "-", "--state-dir", str(cwd / "state"), "--output", "json")
    assert code == 2, err  # nothing runs yet: everything to add
    assert json.loads(out)["steps"]
    assert ".opsctl" not in os.listdir(cwd)


@pytest.mark.parametrize(("data", "problem"), [
    (b"name: x\n" + b"#" * (specfile.SPEC_LIMIT + 1), "too big"),
    (b"name: \xff\n", "not UTF-8"),
])
def test_bad_stdin_is_a_clear_error(data: bytes, problem: str, cwd: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    feed(monkeypatch, data)
    code, _, err = run(capsys, "validate", "-f", "-")
    assert code == 1 and f"<stdin>: the spec is {problem}" in err and "Traceback" not in err, err


def test_stdin_is_read_once(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    feed(monkeypatch, yaml.safe_dump(make_spec("standalone")))
    specfile.read_spec("-")
    with pytest.raises(OpsctlError, match="read already"):
        specfile.read_spec("-")
