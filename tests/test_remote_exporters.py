"""redis_exporters on real SSH hosts (issue 24 with provider: ansible): three network-namespace hosts with their own
sshd, driven through the CLI as a user would (ansible-runner and paramiko).

A Sentinel topology (Redis 7.0 from the OS package, password mode, the admin password a canary) with
metrics.exporter: apply runs exporters.yml, which installs prometheus-redis-exporter (already there on the lab's
shared filesystem: the package task finds it installed) and runs one exporter per server and Sentinel as the system
user opsctl-exporter. Every exporter answers /metrics with redis_up 1; the exporter's ACL user is refused SET,
CONFIG SET, FLUSHALL and KEYS; its password lies only in its 0600 file (no process list or environment here or on the
hosts, no artifact, event or output shows it); an exporter killed behind opsctl's back and a changed port_offset
are drift that plan shows and apply heals; `metrics targets --write-to HOST:PATH` writes the targets there; destroy
removes every exporter and its folder.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from opsctl.base.poll import wait_for
from opsctl.base.secrets import Secret
from opsctl.metrics.exporter import EXPORTER_BINARY, PASSWORD_FILE
from opsctl.render.exporteruser import EXPORTER_USER, exporter_secret
from opsctl.spec.layout import Node, exporter_port
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests import netns
from tests.lifecycle import plan_json, run
from tests.support import CONDITION_BOUND, netns_lab, write_spec
from tests.test_remote_e2e import (
    CANARY,
    CANARY_ENV,
    ProcessWatch,
    apply,
    cleanup,
    netns_processes_with,
    remote_spec,
    state_dir,
)

pytestmark = pytest.mark.remote


@pytest.fixture(scope="module")
def lab() -> Any:
    yield from netns_lab(3)


def scrape(node: Node, offset: int) -> str:
    url = f"http://{node.address}:{exporter_port(node, offset)}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def redis_up(text: str) -> str | None:
    return next((line.split()[1] for line in text.splitlines() if line.startswith("redis_up ")), None)


def host_of(lab: netns.Lab, node: Node) -> netns.TestHost:
    return next(h for h in lab.hosts if h.name == node.host)


def exporter_home(loaded: LoadedSpec, node: Node) -> str:
    return f"/var/lib/opsctl/{loaded.spec.name}.exporters/{node.name}"


def exporter_pid(lab: netns.Lab, loaded: LoadedSpec, node: Node) -> int:
    text = lab.ssh(host_of(lab, node), f"cat {exporter_home(loaded, node)}/exporter.pid").stdout.strip()
    return int(text)


def test_exporters_over_ssh(lab: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    monkeypatch.setenv(CANARY_ENV, CANARY)
    data = remote_spec(lab, "sentinel", "redis")
    data["auth"] = {"mode": "password", "password": {"env": CANARY_ENV}}
    data["metrics"] = {"exporter": True}
    spec = write_spec(tmp_path, data)
    loaded = read_spec(spec)
    password = exporter_secret(loaded.spec.name, Secret(CANARY)).reveal()
    offset = loaded.spec.metrics.port_offset
    outputs: list[str] = []
    with cleanup(spec):
        with ProcessWatch(password) as watch, ProcessWatch(CANARY) as admin_watch:
            outputs += apply(capsys, spec, "--output", "json")
        assert watch.seen == [] and admin_watch.seen == [], (watch.seen, admin_watch.seen)
        assert '"playbook": "exporters.yml"' in outputs[1], outputs[1][-3000:]
        for node in loaded.layout.nodes:
            assert redis_up(scrape(node, offset)) == "1", node.name
        assert_least_privilege(loaded, password)
        assert_files_and_processes(lab, loaded)
        assert netns_processes_with(lab, password) == [] and netns_processes_with(lab, CANARY) == []
        assert plan_json(capsys, spec)["steps"] == []

        killed = loaded.layout.servers[1]
        assert lab.ssh(host_of(lab, killed), f"kill {exporter_pid(lab, loaded, killed)}").returncode == 0
        wait_gone(lab, loaded, killed)
        steps = plan_json(capsys, spec)["steps"]
        assert [(s["kind"], s["node"]) for s in steps] == [("start-exporter", killed.name)], steps
        outputs += apply(capsys, spec)
        assert redis_up(scrape(killed, offset)) == "1"

        changed = yaml.safe_load(spec.read_text())
        changed["metrics"]["port_offset"] = offset + 7
        spec.write_text(yaml.safe_dump(changed))
        steps = plan_json(capsys, spec)["steps"]
        assert [(s["kind"], s["node"]) for s in steps] == [("start-exporter", n.name) for n in loaded.layout.nodes]
        outputs += apply(capsys, spec)
        for node in loaded.layout.nodes:
            assert redis_up(scrape(node, offset + 7)) == "1", node.name
        assert plan_json(capsys, spec)["steps"] == []

        written_targets(capsys, lab, spec, loaded)
        code, _, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
        assert code == 0, err
        for host in lab.hosts:
            assert lab.ssh(host, f"test -e /var/lib/opsctl/{loaded.spec.name}.exporters").returncode == 1
            assert lab.processes(host) == ["sshd"], lab.processes(host)
    leaks = subprocess.run(["grep", "-rl", "-e", password, "-e", CANARY, str(tmp_path)], capture_output=True,
                           text=True, check=False)
    assert leaks.stdout == "", f"a password found in {leaks.stdout}"  # state dir, runner artifacts and events
    assert all(password not in text and CANARY not in text for text in outputs)
    assert not (state_dir(loaded) / "ansible" / "exporter-files").exists()


def assert_least_privilege(loaded: LoadedSpec, password: str) -> None:
    """The exporter's user reads INFO and is refused what it must not run (disabled names: unknown commands)."""
    node = loaded.layout.servers[0]
    client = redis.Redis(node.address, node.port, username=EXPORTER_USER, password=password)
    try:
        assert client.info("server")
        config = loaded.spec.hardening.renamed_commands.get("CONFIG", "CONFIG")
        for command in (("SET", "k", "v"), (config, "SET", "maxclients", "100")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        for command in (("FLUSHALL",), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.ResponseError):
                client.execute_command(*command)
    finally:
        client.close()


def assert_files_and_processes(lab: netns.Lab, loaded: LoadedSpec) -> None:
    """Each exporter runs as opsctl-exporter, in its own 0700 folder, its password file 0600 and its user's; its
    environment holds PATH alone."""
    for node in loaded.layout.nodes:
        host, home = host_of(lab, node), exporter_home(loaded, node)
        pid = exporter_pid(lab, loaded, node)
        facts = lab.ssh(host, f"stat -c '%a %U' {home} {home}/{PASSWORD_FILE}; stat -c %U /proc/{pid}; "
                              f"readlink /proc/{pid}/exe; tr '\\0' '\\n' < /proc/{pid}/environ").stdout.split("\n")
        assert facts[:4] == ["700 opsctl-exporter", "600 opsctl-exporter", "opsctl-exporter", EXPORTER_BINARY], facts
        assert [line for line in facts[4:] if line] == ["PATH=/usr/bin:/bin"], facts


def wait_gone(lab: netns.Lab, loaded: LoadedSpec, node: Node) -> None:
    pid = exporter_pid(lab, loaded, node)
    waited = lab.ssh(host_of(lab, node), f"i=0; while kill -0 {pid} 2>/dev/null && [ $i -lt 200 ]; do "
                                         "sleep 0.05; i=$((i+1)); done; ! kill -0 " + str(pid) + " 2>/dev/null")
    assert waited.returncode == 0


def written_targets(capsys: pytest.CaptureFixture[str], lab: netns.Lab, spec: Path, loaded: LoadedSpec) -> None:
    """--write-to HOST:PATH writes the same file_sd JSON that stdout gets, 0644, to that host."""
    code, printed, err = run(capsys, "metrics", "targets", "-f", str(spec))
    assert code == 0, err
    path = f"/var/lib/opsctl/{loaded.spec.name}-targets.json"
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), "--write-to", f"h2:{path}")
    assert code == 0, err + out
    host = lab.hosts[1]
    assert lab.ssh(host, f"cat {path}").stdout == printed
    assert lab.ssh(host, f"stat -c %a {path}; rm {path}").stdout.strip() == "644"
    assert json.loads(printed)[0]["labels"]["topology"] == loaded.spec.name


def test_exporters_speak_tls_with_the_topology_ca(lab: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """tls.enabled with generated certificates (Redis 7.0 from the OS package): each exporter talks rediss:// to its
    node with its own 0600 copies of the topology's CA bundle and the node's certificate and key, never skipping
    verification, and answers redis_up 1 from nodes that refuse a plaintext client."""
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    data = remote_spec(lab, "replication", "redis", tls={"enabled": True, "generate": True},
                       metrics={"exporter": True})
    data["server"]["user"] = "valkey"  # as test_remote_e2e's TLS test: a user whose attributes already match
    spec = write_spec(tmp_path, data)
    loaded = read_spec(spec)
    offset = loaded.spec.metrics.port_offset
    with cleanup(spec):
        apply(capsys, spec)
        for node in loaded.layout.nodes:
            assert redis_up(scrape(node, offset)) == "1", node.name
            host, home = host_of(lab, node), exporter_home(loaded, node)
            pid = exporter_pid(lab, loaded, node)
            argv = lab.ssh(host, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
            assert f"rediss://{node.address}:{node.port}" in argv and f"-tls-ca-cert-file {home}/tls-ca.crt" in argv
            assert "skip-tls-verification" not in argv, argv
            modes = lab.ssh(host, f"stat -c '%a %U' {home}/tls.key {home}/tls-ca.crt").stdout.split("\n")
            assert modes[:2] == ["600 opsctl-exporter", "600 opsctl-exporter"], modes
            with pytest.raises(redis.exceptions.ConnectionError):
                redis.Redis(node.address, node.port, socket_timeout=3).ping()
        key = (state_dir(loaded) / "tls" / "nodes" / f"{loaded.layout.nodes[0].name}.key").read_text().splitlines()[1]
        for step in (["--new-ca"], [], ["--drop-old-ca"]):  # a whole CA rotation: the exporters' copies follow
            code, out, err = run(capsys, "tls", "rotate", "-f", str(spec), *step, "--auto-approve")
            assert code == 0, err + out
            for node in loaded.layout.nodes:
                wait_for(lambda n=node: redis_up(scrape(n, offset)) == "1", CONDITION_BOUND,
                         f"redis_up 1 from {node.name} after tls rotate {' '.join(step)}")
        assert plan_json(capsys, spec)["steps"] == []
        artifacts = state_dir(loaded) / "ansible" / "artifacts"
        assert not any(key in f.read_text(errors="replace") for f in artifacts.rglob("*") if f.is_file())
        code, _, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
        assert code == 0, err
