"""-f DIR on real servers (valkey, redis): a folder of four small topologies (standalone, replication, Sentinel,
cluster) applied, planned empty and statused as one, their targets one file_sd, audited and backed up as one; a
change rolled out in two waves with a gate; a first wave whose server is stalled (SIGSTOP) before its gate halts with
exit 1 naming it, the later topologies untouched, and the same command starts nothing until --resume; opsctl
SIGKILLed mid-rollout, then the same command finishes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV, make_spec, server_binary, server_tmpdir, write_spec

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
NAMES = ("a-solo", "b-repl", "c-sent", "d-clus")
REST = "b-repl,c-sent,d-clus"


def opsctl(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(argv), capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=ROOT, env=_env())


def started(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(_argv(argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_env())


def _argv(argv: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "opsctl.cli.main", *argv]


def _env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module", params=["valkey", "redis"])
def fleet(request: pytest.FixtureRequest) -> Iterator[Path]:
    flavor: str = request.param
    server_binary(flavor)
    with server_tmpdir("opsctl-fleet-") as where:  # the server user reaches it
        yield from _fleet(Path(where), flavor)


def _fleet(folder: Path, flavor: str) -> Iterator[Path]:
    specs = {"a-solo": make_spec("standalone", flavor, hosts=1), "b-repl": make_spec("replication", flavor, hosts=2),
             "c-sent": make_spec("sentinel", flavor, hosts=3),
             "d-clus": make_spec("cluster", flavor, hosts=3, cluster={"replicas_per_master": 0})}
    for name, spec in specs.items():  # each its own host names: one name, one machine across the fleet
        hosts = [{**host, "name": f"{name}-{host['name']}"} for host in spec["hosts"]]
        write_spec(folder, {**spec, "name": name, "hosts": hosts}, f"{name}.yaml")
    (folder / "notes.yml").write_text("just: notes\n")  # no `topology`: not a topology
    try:
        yield folder
    finally:
        opsctl("destroy", "-f", str(folder), "--all", "--purge", "--auto-approve")


def set_maxmemory(folder: Path, value: str) -> None:
    for name in NAMES:
        path = folder / f"{name}.yaml"
        spec = yaml.safe_load(path.read_text())
        spec["memory"]["maxmemory"] = value
        path.write_text(yaml.safe_dump(spec))


def journal(folder: Path) -> dict[str, object]:
    path = folder / ".opsctl" / "fleet-rollout.json"
    return json.loads(path.read_text()) if path.exists() else {}


def wait_journal(folder: Path, field: str, name: str, before: object, timeout: float = CONDITION_BOUND) -> None:
    """Until the journal of a new rollout (not the one keyed before) has name in field."""
    deadline = time.monotonic() + timeout
    while (now := journal(folder)).get("key") == before or name not in now.get(field, []):  # type: ignore[operator]
        assert time.monotonic() < deadline, now
        time.sleep(0.05)


def test_a_folder_applied_planned_empty_statused_as_one(fleet: Path) -> None:
    assert opsctl("validate", "-f", str(fleet)).returncode == 0
    done = opsctl("apply", "-f", str(fleet), "--auto-approve", "--output", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [t["name"] for t in result["topologies"]] == list(NAMES) and not result["failed"]
    assert all(t["healthy"] for t in result["topologies"])
    plan = opsctl("plan", "-f", str(fleet))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert plan.stdout.count("no changes") == 4 and "plan: 4 topologies" in plan.stdout
    status = opsctl("status", "-f", str(fleet), "--output", "json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert [t["healthy"] for t in json.loads(status.stdout)["topologies"]] == [True] * 4
    targets = opsctl("metrics", "targets", "-f", str(fleet), "--out", str(fleet / "targets.json"))
    assert targets.returncode == 0, targets.stderr
    groups = json.loads((fleet / "targets.json").read_text())
    assert sorted({g["labels"]["topology"] for g in groups}) == list(NAMES)  # one file_sd for the fleet
    assert len(groups) == 1 + 2 + 3 + 3 + 3  # standalone, replication, sentinel (servers and sentinels), cluster
    check = opsctl("cluster", "check", "-f", str(fleet))
    assert check.returncode == 0 and "d-clus" in check.stdout and "cluster check: 1 topology" in check.stdout, \
        check.stdout + check.stderr


def test_the_folder_audited_and_backed_up_as_one(fleet: Path) -> None:
    applied = opsctl("apply", "-f", str(fleet), "--auto-approve")  # a no-op after the test above; alone, the deploy
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    audit = opsctl("audit", "-f", str(fleet), "config", "--fail-on", "critical", "--output", "json")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    reports = json.loads(audit.stdout)["topologies"]
    assert [(t["name"], t["spec"]) for t in reports] == [(n, n) for n in NAMES]  # each the single audit's report
    text = opsctl("audit", "-f", str(fleet), "config", "--fail-on", "critical")  # as text: findings, then the total
    assert text.returncode == 0 and text.stdout.splitlines()[-1] == f"audit: {len(NAMES)} topologies", text.stdout
    assert all((f"== {t['name']} ==" in text.stdout) == bool(t["findings"]) for t in reports), text.stdout
    backup = opsctl("backup", "-f", str(fleet), "--to", str(fleet / "backups"), "--only", "d-clus,a-solo")
    assert backup.returncode == 0, backup.stdout + backup.stderr
    assert backup.stdout.splitlines()[-1] == "backup: 2 topologies"
    for name in ("a-solo", "d-clus"):  # each topology under --to's <topology>/
        (made,) = (fleet / "backups" / name).iterdir()
        assert made.name.startswith(f"{name}-") and (made / "manifest.json").is_file()
        assert name in backup.stdout


def test_a_change_rolled_out_in_two_waves(fleet: Path) -> None:
    set_maxmemory(fleet, "72mb")
    assert opsctl("plan", "-f", str(fleet)).returncode == 2
    done = opsctl("apply", "-f", str(fleet), "--waves", "2,100%", "--gate-seconds", "2", "--auto-approve")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wave 1: a-solo, b-repl" in done.stdout and "wave 2: c-sent, d-clus" in done.stdout
    assert opsctl("plan", "-f", str(fleet)).returncode == 0


def test_a_failed_gate_halts_and_starts_nothing_until_resumed(fleet: Path) -> None:
    set_maxmemory(fleet, "80mb")
    pid = _one_pid(fleet, "a-solo")
    command = ("apply", "-f", str(fleet), "--waves", "1,100%", "--gate-seconds", "20", "--auto-approve")
    before = journal(fleet).get("key")
    run = started(*command)
    try:
        wait_journal(fleet, "done", "a-solo", before)  # wave 1 applied: its gate is next
        os.kill(pid, signal.SIGSTOP)
        out, err = run.communicate(timeout=120)
        assert run.returncode == 1, out + err
        assert "HALTED: wave 1: gate: a-solo" in out and f"untouched: {REST.replace(',', ', ')}" in out, out
        assert opsctl("plan", "-f", str(fleet), "--only", REST).returncode == 2  # the change still to come
        again = opsctl(*command)
        assert again.returncode == 1 and "this rollout halted" in again.stderr, again.stdout + again.stderr
        assert opsctl("plan", "-f", str(fleet), "--only", REST).returncode == 2
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = opsctl(*command[:-3], "--gate-seconds", "2", "--auto-approve", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert opsctl("plan", "-f", str(fleet)).returncode == 0


def test_killed_mid_rollout_the_same_command_finishes_it(fleet: Path) -> None:
    set_maxmemory(fleet, "88mb")
    command = ("apply", "-f", str(fleet), "--waves", "1,100%", "--gate-seconds", "1", "--auto-approve")
    before = journal(fleet).get("key")
    run = started(*command)
    wait_journal(fleet, "started", "b-repl", before)  # wave 2 begun
    run.kill()
    run.communicate()
    finished = opsctl(*command)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert opsctl("plan", "-f", str(fleet)).returncode == 0
    status = opsctl("status", "-f", str(fleet))
    assert status.returncode == 0, status.stdout


def _one_pid(fleet: Path, name: str) -> int:
    pids = list((fleet / ".opsctl" / name).glob("*/server.pid"))
    assert len(pids) == 1, pids
    return int(pids[0].read_text())
