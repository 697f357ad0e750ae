"""--output json on the commands that had none (issue 25, convention 8): validate, destroy, bigkey delete, tls ca and
tls rotate print one JSON object on stdout (format_version first) and their progress on stderr; their text output is
what it was."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from opsctl.cli.main import main
from opsctl.spec.layout import split_endpoint
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return write_spec(tmp_path, make_spec("replication", tls={"enabled": True, "generate": True}))


def result(out: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(out)
    assert next(iter(parsed)) == "format_version" and parsed["format_version"] == 1
    return parsed


def test_destroy_json_of_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    plain = write_spec(tmp_path, make_spec("replication"), "plain.yaml")
    code, out, err = run(capsys, "destroy", "-f", str(plain), "--purge", "--output", "json")
    assert code == 0, err
    got = result(out)
    assert got["nothing_to_do"] is True and got["purge"] is True and got["dry_run"] is False
    assert got["lines"][0].startswith("nothing to stop or purge")
    assert json.loads(err.splitlines()[0])["event"] == "note"  # the line as it came: an event on stderr


def test_tls_ca_json_is_the_pem(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text, err = run(capsys, "tls", "ca", "-f", str(spec))
    assert code == 0 and text.startswith("-----BEGIN CERTIFICATE-----"), err
    code, out, err = run(capsys, "tls", "ca", "-f", str(spec), "--output", "json")
    assert code == 0, err
    assert result(out)["pem"] == text


def test_tls_rotate_dry_run_json(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_recorded_placement import _write_records  # the nodes deployed, as apply records them

    loaded = read_spec(spec, secrets=False)
    _write_records(spec.parent / ".opsctl" / loaded.spec.name, list(loaded.layout.servers))
    code, out, err = run(capsys, "tls", "rotate", "-f", str(spec), "--dry-run", "--output", "json")
    assert code == 0, err
    got = result(out)
    assert got["dry_run"] is True and got["mode"] == "certs" and len(got["nodes"]) == 3


@pytest.mark.integration
def test_destroy_and_bigkey_delete_json_on_live_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec_path, loaded):
        address = split_endpoint(loaded.layout.servers[0].endpoint)
        assert address is not None
        host, port = address
        with redis.Redis(host=host, port=port, password=PASSWORD) as client:
            client.rpush("big:list", *range(2000))
        code, out, err = run(capsys, "bigkey", "delete", "-f", str(spec_path), "big:list", "--output", "json",
                             "--auto-approve")
        assert code == 0, err
        got = result(out)
        assert got["key"] == "big:list" and got["type"] == "list" and got["dry_run"] is False
        code, out, err = run(capsys, "destroy", "-f", str(spec_path), "--output", "json", "--auto-approve")
        assert code == 0, err
        got = result(out)
        name = loaded.layout.servers[0].name
        assert got["nothing_to_do"] is False and got["lines"] == [f"stopped {name}"]


class _Resuming(io.StringIO):
    """stderr that resumes a stopped server (SIGCONT) once the run said it waits for it: the wait is the premise."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid, self.resumed = pid, False

    def write(self, text: str) -> int:
        written = super().write(text)
        if not self.resumed and '"nodes-settling"' in self.getvalue():
            self.resumed = True
            os.kill(self.pid, signal.SIGCONT)
        return written


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_wait_for_a_silent_node_is_a_json_event(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, flavor: str) -> None:
    """Issue 34 (events): plan's wait for a node between states was a plain line on stderr under --output json
    (a print in the gather path). Now it is a `nodes-settling` event line, and stdout holds the plan alone."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    with deployed(tmp_path, capsys, "standalone", flavor) as (spec_path, loaded):
        node = loaded.layout.servers[0].name
        pid = int((spec_path.parent / ".opsctl" / loaded.spec.name / node / "server.pid").read_text())
        stderr = _Resuming(pid)
        monkeypatch.setattr(sys, "stderr", stderr)
        os.kill(pid, signal.SIGSTOP)
        try:
            code = main(["plan", "-f", str(spec_path), "--output", "json"])
        finally:
            os.kill(pid, signal.SIGCONT)
            monkeypatch.undo()
        out = capsys.readouterr().out
        assert code == 0, stderr.getvalue() + out
        events = [json.loads(line) for line in stderr.getvalue().splitlines()]
        assert events[0]["event"] == "nodes-settling" and events[0]["timeout"] == 30.0, events
        assert events[0]["waiting"][node].startswith("runs but does not answer"), events
        assert result(out)["steps"] == []  # resumed: nothing to do
