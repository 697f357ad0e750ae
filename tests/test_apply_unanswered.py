"""apply and a node whose process runs but does not answer (stopped, shutting down, loading): apply waits for
it, bounded, and plans from what it became, instead of refusing at once or planning "no changes" for a node
that is going away (the known gap of a restart killed mid-way: the next apply exited 1 "not healthy")."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, run
from tests.support import PASSWORD, PASSWORD_ENV, admin_for

pytestmark = pytest.mark.integration


def server_pid(spec: Path, loaded: LoadedSpec, node: str) -> int:
    return int((spec.parent / ".opsctl" / loaded.spec.name / node / "server.pid").read_text())


@pytest.mark.parametrize("then", [signal.SIGKILL, signal.SIGCONT])
def test_apply_waits_for_a_silent_node_then_plans_from_what_it_became(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], then: signal.Signals) -> None:
    """A replica stopped (SIGSTOP) when apply looks: apply waits; killed meanwhile it is started, resumed it
    answers and nothing is to do. Before: exit 1 at once, 'run but do not answer'."""
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        replica = loaded.layout.node(loaded.layout.shards[0].replicas[0])
        pid = server_pid(spec, loaded, replica.name)
        os.kill(pid, signal.SIGSTOP)
        later = threading.Timer(6.0, os.kill, (pid, then))
        later.start()
        try:
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        finally:
            later.cancel()
            if then == signal.SIGCONT:
                os.kill(pid, signal.SIGCONT)
        assert code == 0, err + out
        assert f"waiting up to 30s for {replica.name}, which runs but does not answer" in err, err
        assert (f"start {replica.name}" in out) == (then == signal.SIGKILL), out
        _healthy_within(capsys, spec, 10.0)  # apply's own closing look settles as long


def _healthy_within(capsys: pytest.CaptureFixture[str], spec: Path, seconds: float) -> None:
    """status exits 0 within seconds (one look is a point in time: under a loaded CI machine one look at a node
    just resumed once found it unhealthy right after apply's look had found it healthy)."""
    deadline = time.monotonic() + seconds
    while True:
        code, out, err = run(capsys, "status", "-f", str(spec))
        if code == 0:
            return
        assert time.monotonic() < deadline, out + err
        time.sleep(0.25)


def test_apply_waits_for_a_master_shutting_down_then_starts_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A master told to stop (SIGTERM) waits for its replicas to catch up before it exits, answering all along
    (INFO shutdown_in_milliseconds): apply waits for it to exit and starts it. Before: apply planned nothing
    for a running master, and the topology was down once it exited."""
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        shard = loaded.layout.shards[0]
        master, replica = loaded.layout.node(shard.master), loaded.layout.node(shard.replicas[0])
        with admin_for(loaded, replica) as admin:
            admin.call("CLIENT", "PAUSE", "3000", "WRITE")  # it answers, but acknowledges nothing for 3 s
        with admin_for(loaded, master) as admin:
            admin.call("SET", "k", "v")
        os.kill(server_pid(spec, loaded, master.name), signal.SIGTERM)
        with admin_for(loaded, master) as admin:  # it acts on SIGTERM at its next cron tick
            while "shutdown_in_milliseconds" not in admin.call("INFO", "server"):
                time.sleep(0.01)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert f"{master.name}, which shuts down" in err and f"start {master.name}" in out, err + out
        assert run(capsys, "status", "-f", str(spec))[0] == 0
        with admin_for(loaded, master) as admin:
            assert admin.call("GET", "k") == "v"


def test_a_node_that_stops_after_apply_looked_is_planned_again(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A node told to stop (by a run killed mid-restart) answers until it acts on it, so apply may plan nothing
    for it, then find it gone: apply plans again and starts it. Here apply is held right after its plan while
    the replica goes away: its stdout is a pipe the test filled, so printing the plan blocks until the test
    reads (a SIGSTOP after reading the plan raced apply's own look under load). Before: exit 1, 'the topology
    is not healthy' (a second apply started it)."""
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        replica = loaded.layout.shards[0].replicas[0]
        pid = server_pid(spec, loaded, replica)
        env = {**os.environ, PASSWORD_ENV: PASSWORD, "PYTHONUNBUFFERED": "1"}
        read_end, write_end = os.pipe()
        filler = fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
        os.write(write_end, b"x" * filler)
        apply = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(spec), "--auto-approve"],
                                 env=env, stdout=write_end, stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        try:
            deadline = time.monotonic() + 60
            while not Path(f"/proc/{apply.pid}/wchan").read_text().endswith("pipe_write"):  # printing its plan
                assert apply.poll() is None and time.monotonic() < deadline, "apply never printed its plan"
                time.sleep(0.01)
            os.kill(pid, signal.SIGKILL)
            while Path(f"/proc/{pid}").exists():
                time.sleep(0.01)
            with os.fdopen(read_end, "rb") as reader:
                assert reader.read(filler) == b"x" * filler
                out = reader.read().decode()
            err = apply.communicate(timeout=120)[1]
        finally:
            apply.kill()
            apply.wait()
        assert out.startswith("Plan: no changes"), out
        assert apply.returncode == 0, out + err
        assert f"{replica} ran when apply looked and is down now: planning again" in err, err
        assert f"start {replica}" in out, out
        assert run(capsys, "status", "-f", str(spec))[0] == 0
