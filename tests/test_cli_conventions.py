"""Issue 33 item 8, the CLI's conventions: -o/--output names a format everywhere and a folder is --dir (render,
inventory); `inventory --output json` prints Ansible's JSON inventory; every backup location read is --from (the
positional `backup verify DIR` kept)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.cli.main import build_parser
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """A usage error: exit 1, a message and a hint on stderr, no traceback."""
    with pytest.raises(SystemExit) as exc:
        run(capsys, *argv)
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "hint:" in err and "Traceback" not in err, err
    return err


# --- -o/--output is a format; a folder is --dir ----------------------------------------------------


@pytest.mark.parametrize("command", ["render", "inventory"])
def test_o_with_a_folder_says_use_dir_and_writes_nothing(command: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_spec("standalone", hosts=1, provider="ansible"))
    for flag in ("-o", "--output"):
        err = usage_error(capsys, command, "-f", str(spec), flag, str(tmp_path / "out"))
        assert f"use --dir {tmp_path / 'out'}" in err and "format" in err, err
    assert not (tmp_path / "out").exists()


def test_init_o_is_the_format_and_the_file_is_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """init had -o FILE beside --output FORMAT: `init -o json` wrote a file named json. Now -o is the format (as on
    every command that has one) and the file is --out, as `plan --out FILE`."""
    target = tmp_path / "t.yaml"
    err = usage_error(capsys, "init", "-o", str(target))
    assert f"use --out {target}" in err and "(text|json)" in err
    assert not target.exists()
    code, out, err = run(capsys, "init", "--topology", "standalone", "--out", str(target), "-o", "json")
    assert code == 0 and json.loads(out)["file"] == str(target) and target.is_file(), err


def test_render_and_inventory_write_into_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = make_spec("standalone", hosts=1, provider="ansible")
    spec = write_spec(tmp_path, data)
    code, out, err = run(capsys, "render", "-f", str(spec), "--dir", str(tmp_path / "r"))
    assert code == 0 and (tmp_path / "r").is_dir(), err
    code, out, err = run(capsys, "inventory", "-f", str(spec), "--dir", str(tmp_path / "inv"))
    assert code == 0 and (tmp_path / "inv" / f"{data['name']}.yml").is_file(), err
    assert "--dir" in out and " -o " not in out  # the printed next command uses the new spelling


def test_every_o_is_a_format_but_on_a_command_without_one() -> None:
    """-o is short for --output (a format) wherever a command has one; `metrics targets` prints one format (json)
    and writes its file with --out."""
    from opsctl.cli.completion import commands

    for command in commands(build_parser()):
        values = dict(command.values)
        if command.path in ("render", "inventory"):
            assert "--dir" in command.options and values["--dir"] is None, command  # a folder: completes paths
        if "-o" not in values:
            continue
        if command.path == "render":
            raise AssertionError("render's -o only says to use --dir: completion does not offer it")
        else:
            assert values["-o"] is not None and "json" in (values["-o"] or ()), command.path


def test_inventory_output_json_is_ansibles_json_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_spec("replication", provider="ansible"))
    code, out, err = run(capsys, "inventory", "-f", str(spec), "-o", "json")
    assert code == 0, err
    assert not (tmp_path / "inv").exists()  # printed, not written
    inventory = json.loads(out)
    hostvars = inventory["_meta"]["hostvars"]
    groups = {name: group for name, group in inventory.items() if name != "_meta"}
    assert "children" in groups["all"] and all(set(g) <= {"hosts", "children", "vars"} for g in groups.values())
    listed = {h for g in groups.values() for h in g.get("hosts", [])}
    assert listed and listed <= set(hostvars)
    first = next(iter(hostvars.values()))
    assert first["ansible_host"] == {"__ansible_unsafe": first["ansible_host"]["__ansible_unsafe"]}  # never templated
    assert PASSWORD not in out
    ansible_inventory = shutil.which("ansible-inventory", path=str(Path(sys.executable).parent))
    if ansible_inventory is None:
        return
    script = tmp_path / "inv.py"  # what an inventory script would print: Ansible reads it back as it was
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({out!r})\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    listed_back = subprocess.run([ansible_inventory, "-i", str(script), "--list"], capture_output=True, text=True,
                                 check=True, env={**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path)}).stdout
    back = json.loads(listed_back)
    assert back["_meta"]["hostvars"].keys() == hostvars.keys()
    for name, group in groups.items():  # ("all" lists its hosts in the groups they are in)
        assert name == "all" or sorted(back[name].get("hosts", [])) == sorted(group.get("hosts", [])), name
    host = next(iter(hostvars))
    assert back["_meta"]["hostvars"][host]["ansible_host"] == hostvars[host]["ansible_host"]


# --- a location read is --from -------------------------------------------------------------------------------


def test_backup_verify_list_and_prune_read_their_location_from_from(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """verify took its location positionally where list, prune and restore take --from: now all take --from, and
    `backup verify DIR` (documented first) stays its alias, saying the same."""
    empty = tmp_path / "backup"
    empty.mkdir()
    by_option = run(capsys, "backup", "verify", "--from", str(empty))
    assert by_option[0] == 1 and "manifest.json" in by_option[2] and "Traceback" not in by_option[2], by_option
    assert run(capsys, "backup", "verify", str(empty)) == by_option
    code, out, err = run(capsys, "backup", "verify", str(empty), "--from", str(empty))
    assert code == 1 and "usage: opsctl backup verify --from" in err
    for action in ("list", "prune"):
        code, out, err = run(capsys, "backup", action, str(empty))
        assert code == 1 and f"hint: opsctl backup {action} --from {empty}" in err, err
    code, out, err = run(capsys, "backup", "list", "--from", str(empty))
    assert code == 0 and "0 base(s)" in out, err


# --- restore --to-time from a location without an archive ------------------------------------------------------


@pytest.mark.parametrize("holds", ["nothing", "a plain backup"])
def test_to_time_from_a_location_without_an_archive_names_the_location(tmp_path: Path, holds: str) -> None:
    """It said "no archive of  reaches back to ...": the topology's name of an archive that is not there. Now the
    location, and the backup it does hold (restored without --to-time)."""
    from opsctl.backup.offsite import open_store
    from opsctl.backup.store import parse_location
    from opsctl.base.errors import RefusedError
    from opsctl.restore.pitr import plan_to_time

    location = tmp_path / "backups"
    location.mkdir()
    if holds == "a plain backup":
        (location / "orders-20261127T140000Z").mkdir()
        (location / "orders-20261127T140000Z" / "manifest.json").write_text("{}")
    with pytest.raises(RefusedError) as exc:
        plan_to_time(open_store(parse_location(str(location))), 1_900_000_000.0)
    assert exc.value.summary.startswith(f"no archive in {location} reaches back to ") and " of  " not in str(exc.value)
    assert "nothing was written" in exc.value.summary
    if holds == "a plain backup":
        assert exc.value.hint == f"restore a backup it holds without --to-time: opsctl restore -f SPEC --from " \
                                 f"{location / 'orders-20261127T140000Z'}"


def test_archive_stopped_is_the_result_line_of_backup_continuous(capsys: pytest.CaptureFixture[str]) -> None:
    """As JSON the stop of `backup --continuous` is its last line, in the envelope as every result is."""
    from opsctl.backup.follow import ArchiveStopped
    from opsctl.cli.commands.backup import event_printer

    with event_printer(True) as emit:
        emit(ArchiveStopped("SIGTERM", "every segment read is archived: shard 1 up to offset 28"))
    line = json.loads(capsys.readouterr().out)
    assert line == {"format_version": 1, "event": "archive-stopped", "signal": "SIGTERM",
                    "detail": "every segment read is archived: shard 1 up to offset 28"}
