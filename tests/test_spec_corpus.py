"""The bad-spec corpus: each tests/specs/bad/*.yaml fails `opsctl validate` with exactly its .expected output.

Run with UPDATE_GOLDEN=1 to rewrite the .expected files (then read the diff: these are user-facing messages).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from opsctl.cli.main import main

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


@pytest.fixture(autouse=True)
def private_secret_files() -> None:
    """A checkout gives files mode 0644; secret files open to others are refused (tested below)."""
    for secret in SPECS.glob("*/secrets/*"):
        secret.chmod(0o600)


REFUSED = {"cluster-too-few-hosts"}  # breaks only a safety rule (anti-affinity): refused, exit 3 (issue 22)


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
    assert code == (3 if spec.stem in REFUSED else 1)
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


MINIMAL = """name: shop
topology: standalone
hosts:
  - {name: h1, address: 127.0.0.1}
auth:
  password: {file: secret.txt}
"""


def secret_spec(tmp_path: Path, mode: int = 0o600, secret: str = "s3cret-value-long-enough\n") -> Path:
    (tmp_path / "secret.txt").write_text(secret)
    (tmp_path / "secret.txt").chmod(mode)
    spec = tmp_path / "spec.yaml"
    spec.write_text(MINIMAL)
    return spec


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_secret_file_open_to_others_is_refused(mode: int, tmp_path: Path, in_dir,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(tmp_path)
    secret_spec(tmp_path, mode)
    code, _, err = run_cli(["validate", "-f", "spec.yaml"], capsys)
    assert code == 1
    assert f"spec.yaml:6: auth.password: secret file secret.txt is open to group or others (mode {mode:04o})" in err
    assert "hint: chmod 600 secret.txt" in err


def test_private_secret_file_is_used(tmp_path: Path, in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(tmp_path)
    secret_spec(tmp_path, 0o600)
    assert run_cli(["validate", "-f", "spec.yaml"], capsys)[0] == 0


@pytest.mark.parametrize("source, what", [("/dev/zero", "is not a regular file"), ("big", "is too big"),
                                          ("folder", "is a folder")])
def test_unbounded_secret_files_are_refused_at_once(source: str, what: str, tmp_path: Path, in_dir,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(tmp_path)
    (tmp_path / "big").write_bytes(b"x" * (1024 * 1024))
    (tmp_path / "big").chmod(0o600)
    (tmp_path / "folder").mkdir()
    (tmp_path / "spec.yaml").write_text(MINIMAL.replace("secret.txt", source))
    started = time.monotonic()
    code, _, err = run_cli(["validate", "-f", "spec.yaml"], capsys)
    assert time.monotonic() - started < 60, "a hang guard, not a benchmark"
    assert code == 1 and f"spec.yaml:6: auth.password: secret file {source} {what}" in err, err


@pytest.mark.parametrize("source, what", [("/dev/zero", "is not a regular file"), ("big.yaml", "is too big"),
                                          (".", "big.yaml: is too big")])  # a folder is a fleet: its spec refused
def test_unbounded_spec_files_are_refused_at_once(source: str, what: str, tmp_path: Path, in_dir,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(tmp_path)
    (tmp_path / "big.yaml").write_text(MINIMAL + "#" * (2 * 1024 * 1024) + "\n")
    started = time.monotonic()
    code, out, err = run_cli(["validate", "-f", source], capsys)
    assert time.monotonic() - started < 60, "a hang guard, not a benchmark"
    assert (code, out) == (1, "") and what in err and "Traceback" not in err


@pytest.mark.parametrize("spec", ["alias-bomb.yaml", "alias-recursive.yaml"])
def test_alias_bombs_end_at_once(spec: str, in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(SPECS / "bad")
    started = time.monotonic()
    code, _, _ = run_cli(["validate", "-f", spec], capsys)
    assert code == 1 and time.monotonic() - started < 60, "a hang guard, not a benchmark"


def test_no_secrets_checks_everything_else(tmp_path: Path, in_dir, capsys: pytest.CaptureFixture[str]) -> None:
    in_dir(tmp_path)
    (tmp_path / "spec.yaml").write_text(MINIMAL.replace("{file: secret.txt}", f"{{env: {UNSET}}}"))
    code, out, err = run_cli(["validate", "--no-secrets", "-f", "spec.yaml"], capsys)
    assert (code, err) == (0, "") and "(secrets not checked)" in out
    assert run_cli(["validate", "-f", "spec.yaml"], capsys)[0] == 1, "without the flag the secret is required"
    (tmp_path / "spec.yaml").write_text(MINIMAL.replace("{file: secret.txt}", f"{{env: {UNSET}}}") +
                                        "memory: {policy: lru}\n")
    code, _, err = run_cli(["validate", "--no-secrets", "-f", "spec.yaml"], capsys)
    assert code == 1 and "unknown maxmemory policy 'lru'" in err and UNSET not in err


def test_ipv6_endpoints_print_with_brackets_and_compare_canonically(tmp_path: Path, in_dir,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from opsctl.spec.layout import canonical_address, endpoint, split_endpoint
    from opsctl.state.specfile import read_spec

    in_dir(tmp_path)
    (tmp_path / "spec.yaml").write_text(MINIMAL.replace("127.0.0.1", '"0:0:0:0:0:0:0:1"')
                                        .replace("{file: secret.txt}", "{env: OPSCTL_TEST_PASSWORD}"))
    code, out, err = run_cli(["validate", "-f", "spec.yaml"], capsys)
    assert (code, err) == (0, "") and "[::1]:7001" in out
    layout = read_spec(tmp_path / "spec.yaml").layout
    assert layout.nodes[0].address == "::1" and layout.nodes[0].bind == ("::1",)
    for ref in ("[::1]:7001", "::1:7001", "0:0:0:0:0:0:0:1:7001", "[0::1]:7001", "shop-1"):
        assert layout.find(ref) is layout.nodes[0], ref
    assert layout.find("::2:7001") is None and layout.find("[::1]:7002") is None
    assert endpoint("127.0.0.1", 1) == "127.0.0.1:1" and endpoint("fe80::1", 2) == "[fe80::1]:2"
    assert canonical_address("0:0:0:0:0:0:0:1") == "::1" and canonical_address("Host-A") == "host-a"
    assert split_endpoint("nonsense") is None
