"""Test helpers that drive the real CLI against real servers: apply, plan, status, destroy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from opsctl.cli.main import main
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import kill_started, make_spec, server_binary, write_spec


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def plan_json(capsys: pytest.CaptureFixture[str], spec: Path) -> dict[str, Any]:
    code, out, err = run(capsys, "plan", "-f", str(spec), "--output", "json")
    assert code in (0, 2), err
    result: dict[str, Any] = json.loads(out)
    return result


@contextmanager
def deployed(tmp_path: Path, capsys: pytest.CaptureFixture[str], topology: str, flavor: str,
             **sections: Any) -> Iterator[tuple[Path, LoadedSpec]]:
    """Apply a fresh spec; always destroy and purge afterwards, even when the test fails."""
    with applied(tmp_path, capsys, make_spec(topology, flavor, **sections)) as result:
        yield result


@contextmanager
def applied(tmp_path: Path, capsys: pytest.CaptureFixture[str],
            spec: dict[str, Any]) -> Iterator[tuple[Path, LoadedSpec]]:
    """Apply spec (a make_spec dict the test adjusted); always destroy and purge afterwards."""
    server_binary(spec["server"]["flavor"])
    spec_path = write_spec(tmp_path, spec)
    original = spec_path.read_text()
    try:
        code, out, err = run(capsys, "apply", "-f", str(spec_path), "--auto-approve")
        assert code == 0, err + out
        yield spec_path, read_spec(spec_path)
    finally:
        _destroy(spec_path, original)
        capsys.readouterr()


def _destroy(spec_path: Path, original: str) -> None:
    """Destroy with the spec as the test left it, or, when the test broke it, as it was deployed; first every
    long-running opsctl process the test left running (a failed test's `follow`: a CI run hung here half an hour)."""
    kill_started()
    if main(["destroy", "-f", str(spec_path), "--auto-approve", "--purge"]) != 0:
        spec_path.write_text(original)  # or the test left most servers down: the topology lock needs --force-lock
        main(["destroy", "-f", str(spec_path), "--auto-approve", "--purge", "--force-lock"])
