"""End to end over real SSH, through the CLI: three network-namespace hosts with their own sshd, provider: ansible.

`opsctl apply -f SPEC --auto-approve` deploys a 3-master/3-replica Valkey cluster (binary shipped by deploy.yml) and
a Sentinel topology (Redis from the OS package, a canary password); the referees check them (redis-cli --cluster
check, `opsctl status`, each sentinel's view); a second apply has an empty plan and runs no Ansible task that
changes anything; `opsctl destroy --purge` leaves the hosts as they were. The cluster and a replication topology
have their ports firewalled from this machine, so all their admin traffic rides SSH tunnels (hosts[].admin_via_ssh):
the cluster's `opsctl failover` and `opsctl cluster reshard` included. The cluster's referees (a cluster client,
redis-cli --cluster check) run inside host h1's network namespace, where the ports are open as on any host.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.cli.main import main
from opsctl.providers.ansible import RECORD, AnsibleProvider
from opsctl.providers.remote.runner import PlaybookResult, parse_event, summarize
from opsctl.spec.layout import sentinel_master_name
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests import netns
from tests.lifecycle import plan_json, run
from tests.support import (
    CONDITION_BOUND,
    PASSWORD,
    admin_for,
    cluster_check,
    make_spec,
    netns_lab,
    server_binary,
    write_spec,
)
from tests.test_slots_reshard import preload
from tests.writer import cluster_client, dataset_checksum

pytestmark = pytest.mark.remote
CANARY = "canary-pw-7f3e9b1c5d2a4e60"
CANARY_ENV = "OPSCTL_CANARY_PW"
CLONE_NEWNET = 0x40000000
RESHARD_SLOTS = 200
T = TypeVar("T")


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    yield from netns_lab(3)


@pytest.fixture
def ssh_env(lab: netns.Lab, monkeypatch: pytest.MonkeyPatch) -> netns.Lab:
    """The CLI checks host keys against the lab's known_hosts (as a user would set it)."""
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    return lab


def remote_spec(lab: netns.Lab, topology: str, flavor: str, ssh_user: str = "root", **extra: Any) -> dict[str, Any]:
    spec = make_spec(topology, flavor, **extra)
    spec["provider"] = "ansible"
    spec["hosts"] = lab.spec_hosts(ssh_user)
    if flavor == "valkey":
        spec["server"]["binary"] = server_binary("valkey")
    else:
        server_binary("redis")  # installed from the OS package by the playbook; fail early if it is missing
    return spec


def state_dir(loaded: LoadedSpec) -> Path:
    return Path(loaded.file).parent / ".opsctl" / loaded.spec.name


def ansible_runs(loaded: LoadedSpec) -> dict[str, PlaybookResult]:
    """Every ansible-runner run under the state dir, summarized from its job_events artifacts."""
    artifacts = state_dir(loaded) / "ansible" / "artifacts"
    runs = {}
    for folder in sorted(artifacts.iterdir()) if artifacts.is_dir() else []:
        events = [e for f in sorted((folder / "job_events").glob("*.json"))
                  if (e := parse_event(f.read_text())) is not None]
        runs[folder.name] = summarize(folder.name, 0, events)
    return runs


def apply(capsys: pytest.CaptureFixture[str], spec: Path, *extra: str) -> tuple[str, str]:
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve", *extra)
    assert code == 0, err + out
    return out, err


def status(capsys: pytest.CaptureFixture[str], spec: Path) -> dict[str, Any]:
    code, out, err = run(capsys, "status", "-f", str(spec), "--output", "json")
    result: dict[str, Any] = json.loads(out)
    assert code == 0 and result["healthy"], (result["health"], err)
    return result


def assert_second_apply_changes_nothing(capsys: pytest.CaptureFixture[str], spec: Path, loaded: LoadedSpec) -> None:
    """Empty plan, and no Ansible task changed anything (no playbook had to run at all)."""
    before = ansible_runs(loaded)
    out, _ = apply(capsys, spec)
    assert "no changes" in out, out
    new = {k: v for k, v in ansible_runs(loaded).items() if k not in before}
    assert sum(r.changed for r in new.values()) == 0, [r.changed_tasks for r in new.values()]
    assert plan_json(capsys, spec)["steps"] == []


def destroy_and_check_hosts(capsys: pytest.CaptureFixture[str], lab: netns.Lab, spec: Path,
                            loaded: LoadedSpec) -> None:
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
    assert code == 0, err
    assert out.count("purged") == len(loaded.layout.nodes)
    root = f"/var/lib/opsctl/{loaded.spec.name}"
    for host in lab.hosts:
        assert lab.ssh(host, f"test -e {root}").returncode == 1, f"{root} is still on {host.name}"
        assert lab.processes(host) == ["sshd"], lab.processes(host)


@contextlib.contextmanager
def cleanup(spec: Path) -> Iterator[None]:
    """Whatever happens in the test, nothing of this spec keeps running on the lab."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])


def test_cluster_through_opsctl_apply(ssh_env: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ports firewalled from this machine: apply, failover, reshard, status, a second apply and destroy work only
    because every admin connection rides an SSH tunnel; keys written before come through unchanged. The login is
    the unprivileged `ops`, which cannot write the deploy folder itself: playbooks and opsctl's own SSH commands
    and SFTP reads escalate through sudo (become)."""
    lab = ssh_env
    spec = write_spec(tmp_path, tunnelled(remote_spec(lab, "cluster", "valkey", ssh_user=netns.LOGIN_USER)))
    assert lab.ssh(lab.hosts[0], "test -w /var/lib/opsctl", user=netns.LOGIN_USER).returncode == 1
    loaded = read_spec(spec)
    assert {n.host for n in loaded.layout.nodes} == {"h1", "h2", "h3"}
    referee = lab.hosts[0]
    with firewalled(lab, *port_range(loaded)), cleanup(spec):
        apply(capsys, spec)
        assert not any(reachable(n.address, n.port) for n in loaded.layout.servers)  # only tunnels get through
        assert "[OK] All 16384 slots covered" in in_netns(referee, check_cluster, loaded)
        runs = ansible_runs(loaded)
        assert [r.playbook.split("-")[0] for r in runs.values()] == ["deploy"]  # one run ships all six nodes
        assert "cluster ok" in status(capsys, spec)["health"]
        before = in_netns(referee, preload_and_checksum, loaded, 3000)
        failover_then_reshard(capsys, spec, loaded)
        assert in_netns(referee, checksum, loaded) == before
        in_netns(referee, check_cluster, loaded)
        assert_second_apply_changes_nothing(capsys, spec, loaded)
        redeploy_what_apply_wrote(lab, loaded)
        process_state_needs_the_nodes_own_server(lab, loaded)
        destroy_and_check_hosts(capsys, lab, spec, loaded)


def tunnelled(spec: dict[str, Any]) -> dict[str, Any]:
    for host in spec["hosts"]:
        host["admin_via_ssh"] = True
    return spec


def port_range(loaded: LoadedSpec) -> tuple[int, int]:
    ports = [n.port for n in loaded.layout.nodes]
    return min(ports), max(ports)


def in_netns(host: netns.TestHost, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a thread that joined the host's network namespace (setns is per thread, and the processes it
    starts inherit it): clients there reach the nodes as the other hosts do, past the firewall of `firewalled`."""
    def joined() -> T:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/run/netns/{host.netns}") as handle:
            if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {host.netns}")
        return fn(*args)

    with ThreadPoolExecutor(max_workers=1) as pool:  # the thread ends with the pool: nothing else joins the host
        return pool.submit(joined).result()


def check_cluster(loaded: LoadedSpec) -> str:
    """redis-cli --cluster check: the referee nobody here wrote. Returns its report."""
    check = cluster_check(loaded.layout.servers[0].endpoint)
    assert check.returncode == 0 and "[ERR]" not in check.stdout, check.stdout + check.stderr
    return check.stdout


def preload_and_checksum(loaded: LoadedSpec, count: int) -> tuple[int, str]:
    preload(loaded, count)
    result = checksum(loaded)
    assert result[0] == count, result
    return result


def checksum(loaded: LoadedSpec) -> tuple[int, str]:
    client = cluster_client(loaded)
    try:
        return dataset_checksum(client, "pre:*")
    finally:
        client.close()


def masters_and_slots(capsys: pytest.CaptureFixture[str], spec: Path) -> dict[str, int]:
    """`opsctl cluster check` (through the tunnels too): each master's name and slot count."""
    code, out, err = run(capsys, "cluster", "check", "-f", str(spec), "--output", "json")
    report = json.loads(out)
    assert code == 0 and report["healthy"], report["problems"] or err
    return {s["master"].split("(")[-1].rstrip(")"): s["slot_count"] for s in report["shards"]}  # "addr:port (name)"


def failover_then_reshard(capsys: pytest.CaptureFixture[str], spec: Path, loaded: LoadedSpec) -> None:
    """A graceful failover of shard 1, then 200 slots from its new master to shard 2's master."""
    shard1, shard2 = loaded.layout.shards[:2]
    before = masters_and_slots(capsys, spec)
    code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "1", "--yes")
    assert code == 0, out + err
    promoted = shard1.replicas[0]
    after_failover = masters_and_slots(capsys, spec)
    assert shard1.master not in after_failover and after_failover[promoted] == before[shard1.master], after_failover
    code, out, err = run(capsys, "cluster", "reshard", "-f", str(spec), "--from", promoted, "--to", shard2.master,
                         "--auto-approve", "--slots", str(RESHARD_SLOTS))
    assert code == 0, out + err
    after = masters_and_slots(capsys, spec)
    assert after[promoted] == before[shard1.master] - RESHARD_SLOTS, after
    assert after[shard2.master] == before[shard2.master] + RESHARD_SLOTS, after


def redeploy_what_apply_wrote(lab: netns.Lab, loaded: LoadedSpec) -> None:
    """deploy.yml over the hosts `opsctl apply` set up, with the very files it wrote: zero changed tasks."""
    provider = AnsibleProvider(loaded, state_dir(loaded), known_hosts=lab.known_hosts)
    try:
        files = {n.name: {name: provider.read_file(n, name) or "" for name in ("redis.conf", RECORD)}
                 for n in loaded.layout.nodes}
        result = provider.deploy(files, start=True)
        assert result.changed == 0, result.changed_tasks
    finally:
        provider.close()


def process_state_needs_the_nodes_own_server(lab: netns.Lab, loaded: LoadedSpec) -> None:
    """process_state reads the pidfile and /proc over SFTP: a pidfile naming another live process (sshd) never
    makes that process the node; the node's own server, found on its port, is (test_reapply_after_a_reboot...:
    with no server there, the node is stopped); the node's own pid back in it is running again."""
    provider = AnsibleProvider(loaded, state_dir(loaded), known_hosts=lab.known_hosts)
    node = loaded.layout.nodes[0]
    host = next(h for h in lab.hosts if h.name == node.host)
    pidfile = provider.paths(node).pid
    try:
        state = provider.process_state(node)
        assert state.running and state.pid, state
        sshd = lab.ssh(host, "pgrep -o -x sshd").stdout.strip()
        assert lab.ssh(host, f"echo {sshd} > {pidfile}").returncode == 0
        assert provider.process_state(node) == state
        assert lab.ssh(host, f"echo {state.pid} > {pidfile}").returncode == 0
        assert provider.process_state(node) == state
    finally:
        provider.close()


class ProcessWatch:
    """Samples every process's argv and environment (this machine and the lab hosts) while it runs."""

    def __init__(self, needle: str) -> None:
        self.needle = needle.encode()
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for proc in Path("/proc").glob("[0-9]*"):
                for name in ("cmdline", "environ"):
                    with contextlib.suppress(OSError):
                        if self.needle in (proc / name).read_bytes():
                            self.seen.append(f"{proc.name}/{name}: {(proc / 'comm').read_text().strip()}")

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_sentinel_through_opsctl_apply_leaks_no_secret(ssh_env: netns.Lab, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis from the OS package; the password is a canary that no artifact, log, event or argv may show."""
    lab = ssh_env
    data = remote_spec(lab, "sentinel", "redis")
    data["auth"] = {"mode": "password", "password": {"env": CANARY_ENV}}
    monkeypatch.setenv(CANARY_ENV, CANARY)
    spec = write_spec(tmp_path, data)
    loaded = read_spec(spec)
    outputs: list[str] = []
    with cleanup(spec):
        with ProcessWatch(CANARY) as watch:
            outputs += apply(capsys, spec, "--output", "json")  # step events go to stderr as JSON
        assert watch.seen == [], watch.seen
        assert '"event": "playbook-task"' in outputs[1], outputs[1][-2000:]  # deploy.yml's tasks, one by one
        health = status(capsys, spec)["health"]
        assert "3 sentinels agree" in health, health
        assert_sentinels_monitor_the_master(loaded)
        assert_second_apply_changes_nothing(capsys, spec, loaded)
        for host in lab.hosts:  # server logs, records and node settings on the hosts; processes there
            found = lab.ssh(host, f"grep -rl {CANARY} /var/lib/opsctl --include=*.log --include=*.json "
                                  "--include=*.env")
            assert found.stdout == "", found.stdout
        assert netns_processes_with(lab, CANARY) == []
        destroy_and_check_hosts(capsys, lab, spec, loaded)
    leaks = subprocess.run(["grep", "-rl", CANARY, str(tmp_path)], capture_output=True, text=True, check=False)
    assert leaks.stdout == "", f"canary found in {leaks.stdout}"  # state dir, runner artifacts and events
    assert all(CANARY not in text for text in outputs)
    assert not (state_dir(loaded) / "ansible" / "files").exists()


def assert_sentinels_monitor_the_master(loaded: LoadedSpec) -> None:
    master = loaded.layout.node(loaded.layout.shards[0].master)
    name = sentinel_master_name(loaded.spec)
    for sentinel in loaded.layout.sentinels:
        with admin_for(loaded, sentinel) as admin:
            assert admin.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name) == [master.address, str(master.port)]
            assert admin.call("SENTINEL", "CKQUORUM", name).startswith("OK")


def netns_processes_with(lab: netns.Lab, needle: str) -> list[str]:
    found = []
    for host in lab.hosts:
        for pid in netns._netns_pids(host.netns):
            for name in ("cmdline", "environ"):
                with contextlib.suppress(OSError):
                    if needle.encode() in Path(f"/proc/{pid}/{name}").read_bytes():
                        found.append(f"{host.name} pid {pid} {name}")
    return found


@contextlib.contextmanager
def firewalled(lab: netns.Lab, first: int, last: int) -> Iterator[None]:
    """Ports first..last on every lab host answer the other hosts (and SSH tunnels) but not this machine: replies
    to the bridge address from those ports are prohibited by a routing rule in each host's namespace."""
    rule = ["pref", "10", "to", lab.gateway, "ipproto", "tcp", "sport", f"{first}-{last}", "prohibit"]
    for host in lab.hosts:
        subprocess.run(["ip", "-n", host.netns, "rule", "add", *rule], check=True, capture_output=True)
    try:
        yield
    finally:
        for host in lab.hosts:
            subprocess.run(["ip", "-n", host.netns, "rule", "del", *rule], check=False, capture_output=True)


def reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.3):
            return True
    except OSError:
        return False


def test_admin_traffic_through_ssh_tunnels(ssh_env: netns.Lab, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Node ports closed to this machine: with admin_via_ssh every admin connection rides an SSH tunnel."""
    lab = ssh_env
    spec = write_spec(tmp_path, tunnelled(remote_spec(lab, "replication", "valkey")))
    loaded = read_spec(spec)
    with firewalled(lab, *port_range(loaded)), cleanup(spec):
        apply(capsys, spec)
        node = loaded.layout.servers[0]
        assert not reachable(node.address, node.port)  # the firewall holds: only the tunnel gets through
        assert "1 master, 2 replicas linked" in status(capsys, spec)["health"]
        restart_by_hand(lab, loaded)
        wait_healthy(capsys, spec)
        assert_second_apply_changes_nothing(capsys, spec, loaded)
        destroy_and_check_hosts(capsys, lab, spec, loaded)


def restart_by_hand(lab: netns.Lab, loaded: LoadedSpec) -> None:
    """playbooks/restart.yml (as an operator runs it) over what `opsctl apply` deployed: a stop and a start each."""
    provider = AnsibleProvider(loaded, state_dir(loaded), known_hosts=lab.known_hosts)
    try:
        assert provider.playbook("restart.yml").changed == 2 * len(loaded.layout.nodes)
    finally:
        provider.close()


def wait_healthy(capsys: pytest.CaptureFixture[str], spec: Path, timeout: float = CONDITION_BOUND) -> None:
    deadline = time.monotonic() + timeout
    while True:
        code, out, _ = run(capsys, "status", "-f", str(spec), "--output", "json")
        if code == 0:
            return
        assert time.monotonic() < deadline, json.loads(out)["health"]
        time.sleep(0.05)


def test_unreachable_host_names_host_and_task(lab: netns.Lab, tmp_path: Path) -> None:
    spec = remote_spec(lab, "standalone", "valkey")
    spec["hosts"][0]["ssh_key"] = str(tmp_path / "wrong_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong_key")], check=True)
    loaded = read_spec(write_spec(tmp_path, spec))
    provider = AnsibleProvider(loaded, tmp_path / "state", known_hosts=lab.known_hosts)
    with pytest.raises(OpsctlError) as caught:
        provider.deploy()
    assert "h1" in caught.value.summary and "task" in caught.value.summary
    assert PASSWORD not in caught.value.render()
    with pytest.raises(OpsctlError) as ssh_caught:
        provider.process_state(loaded.layout.nodes[0])
    assert "h1" in ssh_caught.value.summary


def test_backup_and_restore_over_ssh(ssh_env: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A replication topology on the lab: the backup is a replica's copy, sent as to a replica would be;
    keys deleted afterwards come back with `opsctl restore --from DIR` (keys, values and TTLs)."""
    import redis

    lab = ssh_env
    spec = write_spec(tmp_path, remote_spec(lab, "replication", "valkey"))
    loaded = read_spec(spec)
    master = loaded.layout.servers[0]
    client = redis.Redis(host=master.address, port=master.port, password=PASSWORD)
    with cleanup(spec):
        apply(capsys, spec)
        pipe = client.pipeline(transaction=False)
        for i in range(2000):
            pipe.set(f"r:{i}", f"v{i}", px=3_600_000 if i % 4 == 0 else None)
        pipe.execute()
        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(tmp_path / "backups"), "--output", "json")
        assert code == 0, err + out
        folder = json.loads(out.splitlines()[-1])["dir"]
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        assert manifest["shards"][0]["role"] == "replica" and manifest["shards"][0]["keys"] == {"0": 2000}
        code, out, err = run(capsys, "backup", "verify", folder)
        assert code == 0, err + out
        expiry = {f"r:{i}": client.pexpiretime(f"r:{i}") for i in range(0, 2000, 4)}
        client.delete(*[f"r:{i}" for i in range(0, 2000, 2)])
        code, out, err = run(capsys, "restore", "-f", str(spec), "--from", folder, "--mode", "skip-existing")
        assert code == 0 and "verified" in out, err + out
        assert [client.get(f"r:{i}") for i in range(2000)] == [f"v{i}".encode() for i in range(2000)]
        assert all(abs(client.pexpiretime(k) - at) < 1000 for k, at in expiry.items())


def test_tls_through_ansible_and_ssh_tunnels(ssh_env: netns.Lab, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Redis from the OS package with generated certificates, shipped 0600 by deploy.yml (no_log); admin traffic
    rides SSH tunnels yet verifies each node's certificate against its address; rotation reloads live."""
    lab = ssh_env
    spec_data = tunnelled(remote_spec(lab, "replication", "redis", tls={"enabled": True, "generate": True}))
    # the lab's hosts share this machine's /etc/passwd, where local test servers run as `redis`: a user whose
    # attributes already match what deploy.yml asks for keeps usermod away from it
    spec_data["server"]["user"] = "valkey"
    spec = write_spec(tmp_path, spec_data)
    loaded = read_spec(spec)
    with firewalled(lab, *port_range(loaded)), cleanup(spec):
        apply(capsys, spec)
        assert "1 master, 2 replicas linked" in status(capsys, spec)["health"]
        node = loaded.layout.servers[0]
        folder = f"/var/lib/opsctl/{loaded.spec.name}/{node.name}"
        modes = lab.ssh(lab.hosts[0], f"stat -c '%a %U' {folder}/tls.key {folder}/tls.crt").stdout.split("\n")
        assert [m.split()[0] for m in modes if m] == ["600", "600"], modes
        code, out, err = run(capsys, "tls", "rotate", "--auto-approve", "-f", str(spec))
        assert code == 0 and out.count(": reloaded, presents") == 3, out + err
        code, out, err = run(capsys, "audit", "-f", str(spec), "tls", "config")
        assert code == 0 and "0 findings" in out, out + err
        key = (state_dir(loaded) / "tls" / "nodes" / f"{node.name}.key").read_text().splitlines()[1]
        artifacts = state_dir(loaded) / "ansible" / "artifacts"
        assert not any(key in f.read_text(errors="replace") for f in artifacts.rglob("*") if f.is_file())
        assert_second_apply_changes_nothing(capsys, spec, loaded)
        destroy_and_check_hosts(capsys, lab, spec, loaded)


def test_reapply_after_a_reboot_and_starts_from_two_parties(ssh_env: netns.Lab, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """After a host reboot a node's pidfile may name a live process that is not the node (a pid reused):
    apply starts the node (it was reported `running` and never started) and destroy never signals that process.
    deploy.yml's installer starting nodes while opsctl starts them too launches one server, not two."""
    lab = ssh_env
    spec = write_spec(tmp_path, remote_spec(lab, "replication", "valkey"))
    loaded = read_spec(spec)
    node = loaded.layout.servers[0]
    host = next(h for h in lab.hosts if h.name == node.host)
    provider = AnsibleProvider(loaded, state_dir(loaded), known_hosts=lab.known_hosts)
    with cleanup(spec):
        try:
            apply(capsys, spec)
            stranger = int(lab.ssh(host, "sleep 600 </dev/null >/dev/null 2>&1 & echo $!").stdout)
            rebooted(lab, provider, node, stranger)
            out, _ = apply(capsys, spec)
            assert f"start {node.name}" in out, out
            state = provider.process_state(node)
            assert state.running and state.pid != stranger, state
            assert lab.ssh(host, f"rm {provider.paths(node).pid}").returncode == 0
            assert provider.process_state(node) == state  # found on its port, not called down
            assert "1 master, 2 replicas linked" in status(capsys, spec)["health"]
            silent_then_killed(capsys, lab, spec, provider, loaded.layout.servers[1])
            both_start(lab, loaded, provider)
            rebooted(lab, provider, node, stranger)
            code, _, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
            assert code == 0, err
            assert lab.ssh(host, f"kill {stranger}").returncode == 0  # stop saw no server of the node: it lived on
        finally:
            provider.close()


def silent_then_killed(capsys: pytest.CaptureFixture[str], lab: netns.Lab, spec: Path, provider: AnsibleProvider,
                       node: Any) -> None:
    """A node stopped (SIGSTOP) when apply looks, killed a few seconds later: apply waits for it over SFTP and
    starts it (it used to refuse at once: 'run but do not answer')."""
    pid = provider.process_state(node).pid
    host = next(h for h in lab.hosts if h.name == node.host)
    assert lab.ssh(host, f"kill -STOP {pid}").returncode == 0
    later = threading.Timer(6.0, lab.ssh, (host, f"kill -KILL {pid}"))
    later.start()
    try:
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    finally:
        later.join()
    assert code == 0 and f"{node.name}, which runs but does not answer" in err and f"start {node.name}" in out, \
        err + out


def rebooted(lab: netns.Lab, provider: AnsibleProvider, node: Any, stranger: int) -> None:
    """The node's server gone as in a power loss, its pidfile naming another live process."""
    pid = provider.process_state(node).pid
    host = next(h for h in lab.hosts if h.name == node.host)
    assert lab.ssh(host, f"kill -9 {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.01; done; "
                         f"echo {stranger} > {provider.paths(node).pid}").returncode == 0
    assert not provider.process_state(node).running


def both_start(lab: netns.Lab, loaded: LoadedSpec, provider: AnsibleProvider) -> None:
    """Every node stopped, then deploy.yml with start (its installer starts the nodes where systemd does not run)
    and opsctl's start of the same nodes at once: each node runs one server, and every start reports it."""
    nodes = list(loaded.layout.nodes)
    for node in nodes:
        provider.stop(node)
    files = {n.name: {name: provider.read_file(n, name) or "" for name in ("redis.conf", RECORD)} for n in nodes}
    with ThreadPoolExecutor(max_workers=2) as pool:
        deployed = pool.submit(provider.deploy, files, True)
        assert provider.start_many(nodes) == {}
        deployed.result()
    for node in nodes:
        host = next(h for h in lab.hosts if h.name == node.host)
        folder = provider.paths(node).dir
        servers = lab.ssh(host, f"for p in $(pgrep -f {shlex.quote(server_binary('valkey').rsplit('/', 1)[1])}); do "
                                f"[ \"$(readlink /proc/$p/cwd)\" = {folder} ] && echo $p; done; "
                                f"grep -c 'Address already in use' {folder}/server.log || true")
        pids, _, in_use = servers.stdout.strip().rpartition("\n")
        assert len(pids.split()) == 1 and in_use == "0", (node.name, servers.stdout)
