"""`opsctl metrics rules --dir DIR [--force]` (issue 33, item 5): the alert rules, their promtool tests and the Grafana
dashboard ship in the package, and the command writes them out as they are in the repository: promtool's tests pass
where they are written; no file is written over without --force, none through a link, and a DIR that is missing, a
file or a link is a clear error that writes nothing. (The wheel holding them: tests/test_cli_init.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import monitoring_files
from tests.lifecycle import run
from tests.monitoring import ALERTS, DASHBOARD, MONITORING, RULE_TESTS, promtool
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def expected() -> dict[str, bytes]:
    """What the command must write: the repository's files under their DIR names."""
    return {"alerts.yml": ALERTS.read_bytes(), "opsctl-redis.json": DASHBOARD.read_bytes(),
            **{f"tests/{p.name}": p.read_bytes() for p in RULE_TESTS}}


def test_every_monitoring_file_of_the_repository_is_shipped() -> None:
    shipped = {p.resolve() for p, _ in monitoring_files()}
    assert shipped == {p.resolve() for p in MONITORING.rglob("*") if p.is_file()}


def test_rules_writes_the_repositorys_files_and_promtool_tests_pass_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "metrics", "rules", "--dir", str(tmp_path))
    assert code == 0, err
    assert _tree(tmp_path) == expected()
    assert f"wrote 9 files to {tmp_path}" in out and "promtool test rules" in out, out
    assert all((tmp_path / name).stat().st_mode & 0o777 == 0o644 for name in expected())
    done = promtool("test", "rules", *sorted((tmp_path / "tests").glob("*.yml")))
    assert done.returncode == 0 and done.stdout.count("SUCCESS") == len(RULE_TESTS), done.stdout + done.stderr


def test_rules_writes_over_nothing_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "opsctl-redis.json").write_text("mine\n")
    code, out, err = run(capsys, "metrics", "rules", "--dir", str(tmp_path))
    assert code == 1 and out == "" and "Traceback" not in err, err
    assert "opsctl-redis.json exists already" in err and "--force" in err, err
    assert _tree(tmp_path) == {"opsctl-redis.json": b"mine\n"}  # refused before the first write
    code, out, err = run(capsys, "metrics", "rules", "--dir", str(tmp_path), "--force")
    assert code == 0 and "(1 replaced)" in out, err
    assert _tree(tmp_path) == expected()


def test_rules_never_writes_through_a_link_even_with_force(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    folder = tmp_path / "rules"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "nodes.yml").symlink_to(victim)
    code, out, err = run(capsys, "metrics", "rules", "--dir", str(folder), "--force")
    assert code == 1 and out == "" and "nodes.yml: is a symbolic link" in err and "Traceback" not in err, err
    assert victim.read_text() == "keep\n" and not (folder / "alerts.yml").exists()


@pytest.mark.parametrize("kind", ["missing", "file", "link"])
def test_a_dir_that_is_not_a_folder_is_a_clear_error(kind: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out"
    if kind == "file":
        target.write_text("x\n")
    elif kind == "link":
        (tmp_path / "real").mkdir()
        target.symlink_to(tmp_path / "real")
    code, out, err = run(capsys, "metrics", "rules", "--dir", str(target))
    said = {"missing": "does not exist", "file": "is not a folder", "link": "is a symbolic link"}[kind]
    assert code == 1 and out == "" and f"{target}: {said}" in err and "hint:" in err, err
    assert kind != "link" or "readlink -f DIR" in err, err  # the link is on the command line: its folder is the way
    assert "Traceback" not in err and "internal error" not in err, err
    assert not target.exists() if kind == "missing" else kind == "file" or not any((tmp_path / "real").iterdir())


def test_targets_past_65535_are_an_error_even_without_exporters(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33's class "a port escapes the checks": without metrics.exporter the offset is not validated, but a
    target port past 65535 was printed as if it were one."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = write_spec(tmp_path, make_spec("standalone", standalone={"port": 65000}, metrics={"port_offset": 1000}))
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec))
    assert code == 1 and out == "" and "Traceback" not in err, err
    assert "metrics.port_offset" in err and "exporter port 66000 (port 65000 + 1000) is above 65535" in err, err
