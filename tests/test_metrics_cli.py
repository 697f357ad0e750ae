"""`opsctl metrics targets` and `--metrics-textfile DIR` (issue 24, items 4 and 6): the CLI's thin shell over
metrics.targets and metrics.signals. No server: the targets come from the spec alone; the textfile wrapper is driven
with handlers that succeed, fail and are refused, as every command's handler does."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import pytest

from opsctl.base.errors import EXIT_CHANGES, EXIT_OK, OpsctlError, RefusedError
from opsctl.cli.main import build_parser
from opsctl.cli.runsignals import note_run, recorded
from opsctl.metrics.signals import RECORDED_COMMANDS, textfile_name
from opsctl.state.specfile import read_spec
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec

RECORDED = RECORDED_COMMANDS  # destroy --purge deletes exactly their textfiles


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return write_spec(tmp_path, make_spec("sentinel"))


def test_targets_prints_one_group_per_node(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec))
    assert code == EXIT_OK, err
    groups = json.loads(out)
    kinds = [g["labels"]["kind"] for g in groups]
    assert kinds.count("server") == 3 and kinds.count("sentinel") == 3, groups
    for group in groups:
        assert set(group) == {"targets", "labels"} and len(group["targets"]) == 1
        assert group["labels"]["topology"] == read_spec(spec).spec.name
        assert "role" not in group["labels"]


def test_targets_out_writes_the_file_atomically_readable_by_prometheus(spec: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "sd" / "fleet.json"
    target.parent.mkdir()
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), "--out", str(target))
    assert code == EXIT_OK and out == "", err
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    code, printed, _ = run(capsys, "metrics", "targets", "-f", str(spec))
    assert target.read_text() == printed
    assert sorted(p.name for p in target.parent.iterdir()) == ["fleet.json"]  # no temp file left


def test_targets_out_in_a_missing_folder_is_a_clear_error(spec: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), "--out", str(tmp_path / "nope" / "x.json"))
    assert code == 1 and out == "" and "does not exist" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", RECORDED)
def test_every_recorded_command_takes_metrics_textfile(command: str) -> None:
    parser = build_parser(command.split()[0])
    args = parser.parse_args([*command.split(), "-f", "x.yaml", "--metrics-textfile", "/m",
                              *(["--from", "a", "--to", "b", "--slots", "1"] if command.endswith("reshard") else []),
                              *(["--shard", "1"] if command == "failover" else []),
                              *(["--from", "d"] if command == "restore" else [])])
    assert args.metrics_textfile == "/m"


def test_apply_with_a_missing_textfile_folder_refuses_before_anything(spec: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve", "--metrics-textfile",
                         str(tmp_path / "absent"))
    assert code == 1 and "absent: does not exist" in err and "--collector.textfile.directory" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topology.yaml"]  # nothing written, no state dir


def _args(folder: Path, **extra: object) -> argparse.Namespace:
    return argparse.Namespace(metrics_textfile=str(folder), **extra)


def _handler(code: int = EXIT_OK, error: Exception | None = None, keys: int | None = None):  # type: ignore[no-untyped-def]
    def handler(args: argparse.Namespace) -> int:
        note_run(args, "orders", keys)
        if error is not None:
            raise error
        return code
    return handler


def _outcome(text: str) -> str:
    return next(line.split('outcome="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("opsctl_last_run_outcome{") and line.endswith(" 1"))


def test_a_successful_run_writes_ok_with_its_keys(tmp_path: Path) -> None:
    assert recorded("backup", _handler(keys=42))(_args(tmp_path)) == EXIT_OK
    text = (tmp_path / "opsctl_orders_backup.prom").read_text()
    assert _outcome(text) == "ok" and 'opsctl_last_run_keys_moved{command="backup",topology="orders"} 42' in text
    assert stat.S_IMODE((tmp_path / "opsctl_orders_backup.prom").stat().st_mode) == 0o644


def test_changes_left_count_as_ok_a_refusal_and_an_error_as_such(tmp_path: Path) -> None:
    recorded("apply", _handler(EXIT_CHANGES))(_args(tmp_path))
    assert _outcome((tmp_path / "opsctl_orders_apply.prom").read_text()) == "ok"
    with pytest.raises(RefusedError):
        recorded("apply", _handler(error=RefusedError("no")))(_args(tmp_path))
    assert _outcome((tmp_path / "opsctl_orders_apply.prom").read_text()) == "refused"
    with pytest.raises(RuntimeError):
        recorded("apply", _handler(error=RuntimeError("bug")))(_args(tmp_path))
    text = (tmp_path / "opsctl_orders_apply.prom").read_text()
    assert _outcome(text) == "error"
    success = [line for line in text.splitlines() if line.startswith("opsctl_last_success_timestamp_seconds{")]
    assert float(success[0].rsplit(" ", 1)[1]) > 0  # the failed runs kept the first run's success time


def test_a_dry_run_or_a_run_that_never_read_its_spec_writes_nothing(tmp_path: Path) -> None:
    recorded("restore", _handler())(_args(tmp_path, dry_run=True))

    def unread(args: argparse.Namespace) -> int:
        raise OpsctlError("spec.yaml: not found")

    with pytest.raises(OpsctlError):
        recorded("restore", unread)(_args(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_failing_write_never_hides_the_runs_own_error(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "opsctl_orders_backup.prom").mkdir()  # the target is a folder: the write fails

    with pytest.raises(RuntimeError, match="the run's own"):
        recorded("backup", _handler(error=RuntimeError("the run's own")))(_args(folder))


def test_targets_need_no_secret(spec: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    """A Prometheus host lists the targets without holding the fleet's password."""
    monkeypatch.delenv(PASSWORD_ENV)
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec))
    assert code == EXIT_OK and len(json.loads(out)) == 6, err



def test_destroy_purge_removes_the_topologys_textfiles_only(spec: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A purged topology's textfiles would keep its alerts firing (OpsctlBackupMissing 26 h after its last backup):
    `destroy --purge --metrics-textfile DIR` deletes exactly its own (another topology whose name starts with this
    one's keeps its files; a link goes, its target stays), a dry run names them, without --purge it is refused."""
    name = read_spec(spec).spec.name
    folder = tmp_path / "textfiles"
    folder.mkdir()
    mine = [folder / textfile_name(name, c) for c in ("backup", "cluster reshard")]
    for path in mine:
        path.write_text("x\n")
    other = folder / textfile_name(f"{name}_b", "backup")
    other.write_text("x\n")
    elsewhere = tmp_path / "elsewhere.prom"
    elsewhere.write_text("kept\n")
    link = folder / textfile_name(name, "apply")
    link.symlink_to(elsewhere)
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--metrics-textfile", str(folder), "--auto-approve")
    assert code == 1 and "only --purge does" in err and "Traceback" not in err, err
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge", "--metrics-textfile", str(tmp_path / "no"),
                         "--auto-approve")
    assert code == 1 and "does not exist" in err, err
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge", "--metrics-textfile", str(folder),
                         "--dry-run")
    assert code == 0 and out.count("would remove") == 3, out + err
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in [*mine, other, link])
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge", "--metrics-textfile", str(folder),
                         "--auto-approve")
    assert code == 0 and out.count("removed ") == 3, out + err
    assert [p.name for p in folder.iterdir()] == [other.name] and elsewhere.read_text() == "kept\n"
