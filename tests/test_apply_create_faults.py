"""A cluster's creation killed mid-way (opsctl SIGKILLed at each phase of form-cluster): the next apply finishes it,
and redis-cli --cluster check passes. A run that lost its topology lock launches no server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import redis

from opsctl.cli import main
from opsctl.observe.parse import parse_info
from opsctl.spec.layout import Node
from opsctl.specfile import read_spec
from tests.lifecycle import plan_json, run
from tests.support import PASSWORD, PASSWORD_ENV, cluster_check, make_spec, server_binary, write_spec

pytestmark = pytest.mark.integration


def _info(node: Node) -> dict[str, str]:
    client = redis.Redis(node.address, node.port, password=PASSWORD, socket_timeout=0.5, socket_connect_timeout=0.5,
                         decode_responses=True)
    try:
        return {**client.info("replication"), **parse_info(client.execute_command("CLUSTER", "INFO"))}
    except redis.RedisError:
        return {}
    finally:
        client.close()


POINTS: dict[str, Callable[[dict[str, str]], bool]] = {
    "answering": lambda info: bool(info),  # servers started, nothing set up yet (or the first setups)
    "slots": lambda info: info.get("cluster_slots_assigned", "0") != "0",  # epochs and slots, meets under way
    # replicas have met their masters and nobody else, REPLICATE not sent yet (or not to every replica)
    "met": lambda info: info.get("cluster_known_nodes", "1") != "1" and info.get("role") == "master",
    "replica": lambda info: info.get("role") == "slave",  # replicas attached, then met by the rest, met again
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_cluster_creation_killed_mid_way_is_finished_by_the_next_apply(tmp_path, capsys, point) -> None:
    server_binary("valkey")
    spec = write_spec(tmp_path, make_spec("cluster", "valkey"))
    servers = read_spec(spec).layout.servers
    proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli", "apply", "-f", str(spec), "--auto-approve"],
                            env={**os.environ, PASSWORD_ENV: PASSWORD}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not any(POINTS[point](_info(n)) for n in servers) and proc.poll() is None:
            assert time.monotonic() < deadline, f"apply never reached {point}"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert plan_json(capsys, spec)["steps"] == []
        check = cluster_check(servers[0].endpoint)
        assert check.returncode == 0 and "All 16384 slots covered" in check.stdout, check.stdout + check.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
        capsys.readouterr()


def test_a_run_that_lost_its_topology_lock_starts_no_server(tmp_path) -> None:
    """Starts go out together (one wave), checked against the lock once before any launch, as each step is."""
    from opsctl.errors import OpsctlError
    from opsctl.events import ignore
    from opsctl.executor import execute
    from opsctl.plan.steps import Plan, StartNode
    from opsctl.runtime import make_runtime
    from opsctl.topolock import topology_lock

    server_binary("valkey")
    loaded = read_spec(write_spec(tmp_path, make_spec("cluster", "valkey")))
    rt = make_runtime(loaded)
    plan = Plan(loaded.spec.name, "d", "f", tuple(StartNode(n.name, "new node") for n in loaded.layout.servers))
    # the lock's own exit says the loss too (a run that ends while its lock is lost fails)
    with pytest.raises(OpsctlError, match="lost the topology lock"), \
            topology_lock(rt.connector, lease=2.0, unanswered_ok=True) as lock:
        lock._stop.set()  # the renewer stops, and the clock says 3 s went by: a run paused past its lease
        assert lock._renewer is not None
        lock._renewer.join()
        lock._renewed_at -= 3
        with pytest.raises(OpsctlError, match="lost the topology lock"):
            execute(rt, plan, ignore)
    assert not any(rt.provider.process_state(n).running for n in loaded.layout.servers)
    assert not (rt.state_dir / loaded.layout.servers[0].name).exists()  # not even a folder: nothing launched
