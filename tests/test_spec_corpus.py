"""The bad-spec corpus: each tests/specs/bad/*.yaml fails `opsctl validate` with exactly its .expected output.

Run with UPDATE_GOLDEN=1 to rewrite the .expected files (then read the diff: these are user-facing messages).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opsctl.cli import main

SPECS = Path(__file__).parent / "specs"
BAD = sorted((SPECS / "bad").glob("*.yaml"))
GOOD = sorted((SPECS / "good").glob("*.yaml"))
UNSET = "OPSCTL_SPEC_TEST_UNSET_VARIABLE"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def in_dir(monkeypatch: pytest.MonkeyPatch):
    def chdir(path: Path) -> None:
        monkeypatch.chdir(path)
        monkeypatch.delenv(UNSET, raising=False)

    return chdir


def test_corpus_is_big_enough() -> None:
    assert len(BAD) >= 35
    assert len(GOOD) >= 3


@pytest.mark.parametrize("spec", BAD, ids=[p.stem for p in BAD])
def test_bad_spec_reports_exactly(spec: Path, in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(spec.parent)
    code, out, err = run_cli(["validate", "-f", spec.name], capsys)
    expected = spec.with_suffix(".expected")
    if UPDATE:
        expected.write_text(err)
    assert code == 1
    assert out == ""
    assert "Traceback" not in err
    assert err == expected.read_text()


@pytest.mark.parametrize("spec", BAD, ids=[p.stem for p in BAD])
def test_bad_spec_problems_name_file_and_line(spec: Path, in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    """Every problem line says file:line; every problem has a hint unless the message is self-explaining."""
    in_dir(spec.parent)
    _, _, err = run_cli(["validate", "-f", spec.name], capsys)
    lines = err.splitlines()
    assert lines[0].startswith(f"error: {spec.name}: ")
    problems = [line for line in lines[1:] if not line.startswith("  hint: ")]
    assert problems
    assert all(line.startswith(f"{spec.name}:") and line.split(":")[1].isdigit() for line in problems)


def test_several_problems_are_all_reported(in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(SPECS / "bad")
    _, _, err = run_cli(["validate", "-f", "many-problems.yaml"], capsys)
    assert err.startswith("error: many-problems.yaml: 10 problems in the spec\n")
    lines = [int(line.split(":")[1]) for line in err.splitlines()[1:] if not line.startswith("  ")]
    assert lines == sorted(lines), "problems are listed in file order"


def test_missing_spec_file(in_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(tmp_path)
    code, _, err = run_cli(["validate", "-f", "nope.yaml"], capsys)
    assert (code, err) == (1, "error: spec file not found: nope.yaml\n  hint: pass the topology file with -f\n")


@pytest.mark.parametrize("spec", GOOD, ids=[p.stem for p in GOOD])
def test_good_spec_validates(spec: Path, in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(spec.parent)
    code, out, err = run_cli(["validate", "-f", spec.name], capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"{spec.name}: valid ")


def test_secret_values_never_appear_in_problems(in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(SPECS / "bad")
    _, _, err = run_cli(["validate", "-f", "weak-secret.yaml"], capsys)
    weak = (SPECS / "bad" / "secrets" / "weak.txt").read_text().strip()
    assert "too weak" in err
    assert weak not in err
