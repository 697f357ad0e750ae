"""opsctl status --watch: the table redrawn in place with ops/s, on a real deployment, until Ctrl-C."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from opsctl.cli.main import main
from opsctl.cli.watch import HOME_AND_CLEAR, frame
from opsctl.state.standbyfiles import StandbyStatus
from opsctl.status.looks import NodeStatus, StatusResult
from tests.lifecycle import deployed
from tests.support import PASSWORD, PASSWORD_ENV


def _row(name: str, ops: int | None) -> NodeStatus:
    return NodeStatus(name=name, endpoint="127.0.0.1:7000", host="h1", state="up", role="master", link="-",
                      offset=10, lag=None, memory="1.0M/unlimited", keys=3, slots=0, shard=0, ops_per_sec=ops)


def test_a_frame_says_when_how_often_and_shows_ops_per_second() -> None:
    status = StatusResult("shop", "standalone", False, "standalone degraded: 1 node(s) down: b",
                          (_row("a", 1234), _row("b", None)), "start it")
    text = frame(status, 2.0, datetime(2026, 11, 27, 14, 1, 0, tzinfo=timezone.utc))
    lines = text.splitlines()
    assert lines[0] == "opsctl status 'shop' every 2s, 2026-11-27 14:01:00Z (Ctrl-C to stop)"
    assert lines[2].split()[-1] == "OPS/S"
    assert lines[3].split()[-1] == "1234" and lines[4].split()[-1] == "-"
    assert lines[-2:] == ["standalone degraded: 1 node(s) down: b", "  hint: start it"]


def test_a_standbys_frame_ends_with_its_link() -> None:
    link = StandbyStatus("not-following", "shop-east", report_age=12.0, hint="run `opsctl follow -f shop.yaml`")
    status = StatusResult("shop", "standalone", True, "standalone healthy", (_row("a", 5),), None, link)
    lines = frame(status, 2.0, datetime(2026, 11, 27, 14, 1, 0, tzinfo=timezone.utc)).splitlines()
    assert lines[-2:] == ["standalone healthy", link.line()]
    assert "standby of shop-east: not following, last report 12s ago" in lines[-1]


@pytest.mark.parametrize(("value", "why"), [("0.1", "out of range (0.5..3600)"), ("0", "out of range"),
                                            ("3601", "out of range"), ("nan", "not a finite number")])
def test_a_refresh_out_of_range_is_refused_with_exit_1(value, why, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "-f", "spec.yaml", "--watch", value])
    assert exited.value.code == 1
    assert why in capsys.readouterr().err


def _read_until(fd: int, needle: bytes, count: int, deadline: float) -> bytes:
    """What the pty's other end got until needle appeared count times (or the deadline)."""
    seen = b""
    while seen.count(needle) < count and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


@pytest.mark.integration
def test_watch_redraws_in_place_on_a_terminal_and_ctrl_c_ends_it_healthy(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, _):
        leader, follower = os.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "status", "-f", str(spec), "--watch", "0.5"],
                                stdout=follower, stderr=subprocess.PIPE, env={**os.environ, PASSWORD_ENV: PASSWORD})
        os.close(follower)
        try:
            seen = _read_until(leader, HOME_AND_CLEAR.encode(), 3, time.monotonic() + 30)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)
        finally:
            proc.kill()
            os.close(leader)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        text = seen.decode(errors="replace")
        assert text.count(HOME_AND_CLEAR) >= 3, text[-2000:]
        assert "OPS/S" in text and "replication ok" in text
        assert code == 0, stderr
        assert PASSWORD not in text + stderr


@pytest.mark.integration
def test_watch_as_json_prints_one_envelope_per_refresh(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, _):
        proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "status", "-f", str(spec), "--watch", "0.5",
                                 "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, PASSWORD_ENV: PASSWORD})
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        looks = [json.loads(line) for line in lines]
        assert [look["format_version"] for look in looks] == [1, 1]
        assert all(look["healthy"] and isinstance(look["nodes"][0]["ops_per_sec"], int) for look in looks)
        assert code == 0
