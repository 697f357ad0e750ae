"""metrics.exporter: true on real servers (issue 24): apply runs one redis_exporter beside each server of a local
3+3 cluster, logged in as its own least-privilege ACL user; every exporter answers redis_up 1, the user is refused
SET, CONFIG SET, FLUSHALL and KEYS, its password is on no process's command line or in any environment, a real
Prometheus fed `opsctl metrics targets -o` sees every target up, a changed setting shows in plan, and destroy stops
them. Fails (not skips) under CI=true without Debian's prometheus-redis-exporter and prometheus."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import yaml

from opsctl.base.secrets import Secret
from opsctl.metrics.exporter import EXPORTER_BINARY
from opsctl.render.exporteruser import EXPORTER_USER, exporter_secret
from opsctl.spec.layout import Node, exporter_port
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import PASSWORD, missing

pytestmark = pytest.mark.integration
WAIT_S = 60.0


def _needs(path: str, package: str) -> None:
    if not os.access(path, os.X_OK):
        missing(f"{path} (apt-get install {package})")


def _scrape(node: Node, offset: int) -> str:
    with urllib.request.urlopen(f"http://{node.address}:{exporter_port(node, offset)}/metrics", timeout=10) as r:
        return str(r.read().decode())


def _redis_up(text: str) -> str | None:
    return next((line.split()[1] for line in text.splitlines() if line.startswith("redis_up ")), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _prometheus(tmp_path: Path, targets: Path, rules: Path | None = None,
                static: list[str] | None = None) -> Iterator[str]:
    """A real Prometheus on loopback scraping the file_sd targets every second (and the static targets as job
    `opsctl`; rules evaluated every second); yields its URL."""
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    scrapes: list[dict[str, object]] = [{"job_name": "redis", "file_sd_configs": [{"files": [str(targets)]}]}]
    if static:
        scrapes.append({"job_name": "opsctl", "static_configs": [{"targets": static}]})
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)] if rules else [], "scrape_configs": scrapes}))
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        ["/usr/bin/prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def _targets_up(url: str, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + WAIT_S
    active: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=5) as reply:
                active = json.loads(reply.read())["data"]["activeTargets"]
        except OSError:
            active = []
        if len(active) == count and all(t["health"] == "up" for t in active):
            return active
        time.sleep(0.5)
    raise AssertionError(f"not every target up within {WAIT_S:g} s: {active}")


def _proc_texts() -> list[tuple[int, str, bytes]]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        for name in ("cmdline", "environ"):
            try:
                found.append((int(entry.name), name, Path(entry.path, name).read_bytes()))
            except OSError:
                continue
    return found


# password mode (the user as a `user` line beside requirepass) on Redis 7.0; ACL mode (users.acl) on Valkey 9.1, with
# no command disabled by name, so the ACL alone refuses FLUSHALL and KEYS
CASES = {"redis-password": ("redis", {}),
         "valkey-acl": ("valkey", {"auth": {"mode": "acl", "password": {"env": "OPSCTL_TEST_PASSWORD"}},
                                   "hardening": {"disabled_commands": []}})}


@pytest.mark.parametrize("case", sorted(CASES))
def test_apply_runs_a_least_privilege_exporter_beside_every_server(tmp_path: Path, case: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    _needs("/usr/bin/prometheus", "prometheus")
    flavor, sections = CASES[case]
    with deployed(tmp_path, capsys, "cluster", flavor, metrics={"exporter": True}, **sections) as (spec, loaded):
        offset = loaded.spec.metrics.port_offset
        servers = loaded.layout.servers
        for node in servers:
            assert _redis_up(_scrape(node, offset)) == "1", node.name
        assert plan_json(capsys, spec)["steps"] == []
        password = exporter_secret(loaded.spec.name, Secret(PASSWORD)).reveal()
        node = servers[0]
        client = redis.Redis(node.address, node.port, username=EXPORTER_USER, password=password)
        assert client.info("server")
        config = loaded.spec.hardening.renamed_commands.get("CONFIG", "CONFIG")  # the name the server knows
        for command in (("SET", "k", "v"), (config, "SET", "maxclients", "100"), ("GET", "k")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        # disabled by hardening as well (unknown commands then); without that, refused by the ACL
        refused = redis.exceptions.ResponseError if loaded.spec.hardening.disabled_commands else \
            redis.exceptions.NoPermissionError
        for command in (("FLUSHALL",), ("KEYS", "*")):
            with pytest.raises(refused):
                client.execute_command(*command)
        client.close()
        leaks = [(pid, name) for pid, name, text in _proc_texts() if password.encode() in text]
        assert leaks == []
        for node in servers:
            secret_file = tmp_path / "state" / node.name / "exporter-password.json"
            secret_file = secret_file if secret_file.exists() else next(tmp_path.rglob(
                f"{node.name}/exporter-password.json"))
            assert secret_file.stat().st_mode & 0o777 == 0o600
        targets = tmp_path / "targets.json"
        code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), "--out", str(targets))
        assert code == 0, err
        with _prometheus(tmp_path, targets) as url:
            active = _targets_up(url, len(loaded.layout.nodes))
        assert {t["labels"]["node"] for t in active} == {n.name for n in servers}  # type: ignore[index]

        changed = yaml.safe_load(spec.read_text())
        changed["metrics"]["port_offset"] = offset + 7
        spec.write_text(yaml.safe_dump(changed))
        steps = plan_json(capsys, spec)["steps"]
        assert [(s["kind"], s["node"]) for s in steps] == [("start-exporter", n.name) for n in servers]
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        for node in servers:
            assert _redis_up(_scrape(node, offset + 7)) == "1", node.name
        assert plan_json(capsys, spec)["steps"] == []
    exporters = [pid for pid, name, text in _proc_texts() if name == "cmdline" and str(tmp_path).encode() in text
                 and b"exporter" in text]
    assert exporters == []


def test_an_exporter_whose_port_another_process_holds_is_not_counted_as_started(tmp_path: Path, capsys) -> None:
    """The port accepts (another process's socket), yet the exporter fails to bind it and exits: apply says so with
    the exporter's own words and records nothing; once the port is free, apply starts it."""
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded):
        node = loaded.layout.servers[0]
        text = yaml.safe_load(spec.read_text())
        text["metrics"] = {"exporter": True}
        spec.write_text(yaml.safe_dump(text, sort_keys=False))
        offset = read_spec(spec).spec.metrics.port_offset
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((node.address, exporter_port(node, offset)))
        squatter.listen()
        try:
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 1 and "did not start" in err and "address already in use" in err, out + err
            assert "ss -ltnp" in err
        finally:
            squatter.close()
        assert [s["kind"] for s in plan_json(capsys, spec)["steps"]] == ["start-exporter"]
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        assert _redis_up(_scrape(node, offset)) == "1"
