"""SIGTERM and SIGINT in the middle of a reshard (Valkey 9.1, key by key and atomic): opsctl stops at a safe point
(the waves already open are finished, an atomic job is cancelled), journals it, says how to go on and exits
128 + the signal's number; no slot stays open on any node, replicas included; the re-run finishes the move.
Referees: a concurrent writer recording acknowledged writes, a count + checksum of the preloaded keys,
redis-cli --cluster check and an empty plan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.base.poll import wait_for
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV, admin_for
from tests.test_slots_reshard import preload, referee_ok
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def start_reshard(spec: Path, source: str, target: str, slots: int, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, PASSWORD_ENV: PASSWORD}
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "opsctl.cli.main", "cluster", "reshard",
                             "-f", str(spec), "--auto-approve", "--from", source, "--to", target,
                             "--slots", str(slots), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_started(proc: subprocess.Popen[str], spec: Path, loaded: LoadedSpec) -> None:
    """Until the move is under way (its journal exists and a slot is open on the servers): the signal lands
    mid-move."""
    journal = spec.parent / ".opsctl" / loaded.spec.name / "slots-journal.jsonl"
    deadline = time.monotonic() + 60
    while not journal.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert journal.exists(), "the reshard did not start moving"

    def moving() -> dict[str, str] | None:
        assert proc.poll() is None, "the reshard ended before a slot was seen open"
        return open_slots(loaded) or None
    wait_for(moving, CONDITION_BOUND, "a slot open on the servers (the move under way)", 0.01)


def open_slots(loaded: LoadedSpec) -> dict[str, str]:
    """Every node (replicas too) that shows a slot MIGRATING or IMPORTING: its myself line."""
    found = {}
    for node in loaded.layout.servers:
        with admin_for(loaded, node) as admin:
            mine = next(line for line in str(admin.call("CLUSTER", "NODES")).splitlines() if "myself" in line)
        if "->-" in mine or "-<-" in mine:
            found[node.name] = mine
    return found


@pytest.mark.parametrize(("sig", "mode"), [(signal.SIGTERM, "key-by-key"), (signal.SIGINT, "key-by-key"),
                                           (signal.SIGTERM, "atomic"), (signal.SIGINT, "atomic")],
                         ids=["sigterm-key-by-key", "sigint-key-by-key", "sigterm-atomic", "sigint-atomic"])
def test_a_signal_mid_reshard_stops_cleanly_and_the_rerun_finishes(tmp_path, capsys, sig, mode) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        preload(loaded, 60000 if mode == "atomic" else 20000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        source, target = loaded.layout.shards[0].master, loaded.layout.shards[1].master
        extra = ("--key-by-key", "--max-keys-per-sec", "2000") if mode == "key-by-key" else ()
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(100)
            proc = start_reshard(spec, source, target, 4000, *extra)
            if mode == "atomic":  # a server-side job ends in a blink: signal as soon as it is announced
                assert proc.stderr is not None
                while "moving" not in proc.stderr.readline() and proc.poll() is None:
                    pass
                time.sleep(0.02)  # the signal's point inside the server-side job (fault timing): a sleep
            else:
                wait_started(proc, spec, loaded)
            proc.send_signal(sig)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                out, err = proc.communicate(timeout=10)
                raise AssertionError(err) from None
            sys.__stderr__.write(f"RESHARD {proc.returncode} {out} {err}\n")
            assert "Traceback" not in err and "internal error" not in err, err
            if proc.returncode != 0:  # an atomic job may have ended before the signal landed
                assert proc.returncode == 128 + sig, err + out
                assert f"stopped on {signal.Signals(sig).name}" in err and "hint:" in err, err
            assert open_slots(loaded) == {}  # nothing left open, on masters or replicas
            code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
            assert code == 0, err + out
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        assert writer.verify(client) == []
        assert dataset_checksum(client, "pre:*") == before
        referee_ok(loaded)
