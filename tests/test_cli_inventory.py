"""`opsctl inventory` (issue 25, defect 6): a provider: local spec is refused before anything is written, and the
printed command runs from an installed wheel: deploy.yml by the path it has in the installed package (or in this
checkout), and the installers it needs (--with-files) written first."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from opsctl import data_dir
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def test_a_local_spec_is_refused_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_spec("standalone", hosts=1))
    code, out, err = run(capsys, "inventory", "-f", str(spec), "--dir", str(tmp_path / "inv"))
    assert code == 1 and out == ""
    assert "provider: local" in err and "opsctl apply" in err and "Traceback" not in err
    assert not (tmp_path / "inv").exists()


@pytest.mark.parametrize("with_files", [True, False])
def test_the_printed_command_names_a_playbook_that_exists(tmp_path: Path, with_files: bool,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, {**make_spec("standalone", hosts=1), "provider": "ansible"})
    argv = ["inventory", "-f", str(spec), "--dir", str(tmp_path / "inv"), *(["--with-files"] if with_files else [])]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    command = next(line for line in out.splitlines() if line.startswith("run: "))
    words = shlex.split(command.removeprefix("run: ").split("  (")[0])
    playbook = Path(words[-1])
    assert playbook.is_absolute() and playbook.is_file() and playbook == data_dir("playbooks") / "deploy.yml"
    assert ("--with-files" in words) is not with_files  # without the installers, the command writes them first


def test_json_inventory_says_what_it_wrote_as_json_event_lines(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 34 (events): the files --with-files wrote were plain lines on stderr beside a JSON inventory; now each
    is a `note` event line."""
    import json

    spec = write_spec(tmp_path, {**make_spec("standalone", hosts=1), "provider": "ansible"})
    code, out, err = run(capsys, "inventory", "-f", str(spec), "--dir", str(tmp_path / "inv"), "--with-files",
                         "-o", "json")
    assert code == 0, err
    assert json.loads(out)  # the inventory, alone on stdout
    events = [json.loads(line) for line in err.splitlines()]
    assert events and all(e["event"] == "note" and e["text"] for e in events), err
