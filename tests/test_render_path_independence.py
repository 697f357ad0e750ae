"""Issue 14 case 6: the same spec gives the same plan whatever its path. The rendered files name no path and the
plan digest covers none, so `plan` after `apply` is empty however the spec file is spelled (real servers)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.lifecycle import _destroy, run
from tests.support import make_spec, server_binary, write_spec


@pytest.mark.integration
def test_plan_is_empty_whatever_the_spec_path_spelling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    server_binary("valkey")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    data = make_spec("standalone", "valkey", hosts=1)
    spec = write_spec(checkout, data)
    original = spec.read_text()
    monkeypatch.chdir(checkout)
    try:
        code, out, err = run(capsys, "apply", "-f", spec.name, "--auto-approve")
        assert code == 0, err + out
        state = checkout / ".opsctl" / data["name"]
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        copy = tmp_path / "ci" / "other-name.yaml"
        copy.parent.mkdir()
        shutil.copy(spec, copy)
        spellings = [("plan", "-f", str(spec)), ("plan", "-f", f"./{spec.name}"),
                     ("plan", "-f", f"../checkout/{spec.name}")]
        for argv in spellings:
            code, out, err = run(capsys, *argv)
            assert code == 0 and "no changes" in out.lower(), f"{argv}: {out}{err}"
        monkeypatch.chdir(elsewhere)
        for argv in [("plan", "-f", os.path.relpath(spec, elsewhere)),
                     ("plan", "-f", str(copy), "--state-dir", str(state))]:
            code, out, err = run(capsys, *argv)
            assert code == 0 and "no changes" in out.lower(), f"{argv}: {out}{err}"
    finally:
        monkeypatch.chdir(checkout)
        _destroy(spec, original)

