"""Day 2 end to end (issue 33, "Must show"): one cluster walked through a life on real servers, with exporters, a
continuous archive and a concurrent writer: created (3 x 1 on h1-h3), grown (a host, a replica per shard, a shard),
a host drained, the host then holding half the masters lost (SIGKILLed, its folders deleted) and replaced by apply
(promote-replica, then the new machine), the password rotated, restored to a time into a new topology, destroyed
with --purge, applied again. After each step every `metrics targets` target answers redis_up 1, `status` is healthy,
the next plan is empty, redis-cli --cluster check passes and every acknowledged write is there (losses only within
the kill's window: acknowledged by a killed master after the last WAIT barrier). The figures per step print on
stderr."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from opsctl.backup.timeline import iso
from opsctl.base.errors import ConvergenceError
from opsctl.base.poll import Pending, wait_for
from opsctl.metrics.exporter import EXPORTER_BINARY
from opsctl.net.connector import port_accepts
from opsctl.providers.localfiles import deployed_records_in
from opsctl.providers.proc import working_below
from opsctl.spec.layout import Layout, Node
from opsctl.spec.placement import with_placement
from opsctl.state.specfile import read_spec
from tests.lifecycle import run
from tests.support import (
    CONDITION_BOUND,
    PASSWORD,
    PASSWORD_ENV,
    cluster_check,
    make_spec,
    server_binary,
    write_barrier,
    write_spec,
)
from tests.test_drain_host import record_files
from tests.test_fleet_shape import records
from tests.test_metrics_exporter_live import _needs, _redis_up
from tests.writer import Writer

pytestmark = pytest.mark.integration

NEW_ENV, NEW = "OPSCTL_TEST_DAY2_PASSWORD", "day2-rotated-pw-4b7e1c9a"
OFFSET = 1000  # metrics.port_offset's default
MARGIN = 0.25  # s: a write acknowledged this long after T (the clocks converted) cannot have been read before it


def placed(spec: Path) -> Layout:
    """The nodes deployed, as every command places them: the spec placed from the records."""
    loaded = read_spec(spec)
    return with_placement(loaded, deployed_records_in(loaded, spec.parent / ".opsctl" / loaded.spec.name)).layout


def client_for(spec: Path, password: str) -> RedisCluster:
    """A cluster client of the nodes deployed (placed from the records), with password."""
    nodes = [ClusterNode(n.address, n.port) for n in placed(spec).servers]
    return RedisCluster(startup_nodes=nodes, password=password, decode_responses=True, socket_timeout=2.0,
                        retry=Retry(ExponentialBackoff(cap=0.05, base=0.005), 10))


def node_client(address: str, port: int, password: str) -> redis.Redis:
    return redis.Redis(host=address, port=port, password=password, decode_responses=True, socket_timeout=5.0)


class Archiver:
    """`opsctl backup --continuous --output json` as its own process (the password in its environment), its events
    in a file."""

    def __init__(self, spec: Path, to: Path, log: Path, env: dict[str, str]) -> None:
        argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", str(to), "--continuous",
                "--output", "json"]
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=log.with_suffix(".err").open("wb"),
                                     env={**os.environ, **env})

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def covered(self, shards: int, after: float) -> bool | Pending:
        """Every shard has a segment stored that the archiver closed after `after` (wall clock)."""
        if self.proc.poll() is not None:  # its error, not its progress: a tail of segments hid why it ended
            said = [line for line in (self.log.read_text() + self.log.with_suffix(".err").read_text()).splitlines()
                    if '"segment-archived"' not in line and '"archive-progress"' not in line]
            raise AssertionError(f"the archiver exited {self.proc.returncode}: " + "\n".join(said[-12:])[-4000:])
        done = {e["shard"] for e in self.events() if e["event"] == "segment-archived" and e["durable"] >= after}
        return True if len(done) >= shards else Pending(f"segments of shards {sorted(done)} since {after:.1f}; its "
                                                        f"notes: {self.notes()[-4:]}")

    def wait(self, shards: int, after: float, timeout: float = CONDITION_BOUND) -> None:
        try:
            wait_for(lambda: self.covered(shards, after), timeout, f"the archive to cover {shards} shards",
                     interval=0.1)
        except ConvergenceError as exc:
            tail = [e for e in self.events() if e["event"] != "segment-archived"][-6:]
            raise AssertionError(f"{exc.summary}: {exc.detail}; its last events {tail}; stderr "
                                 f"{self.log.with_suffix('.err').read_text()[-2000:]}") from exc

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(CONDITION_BOUND)

    def notes(self) -> list[str]:
        return [e["text"] for e in self.events() if e["event"] == "note"]


class Life:
    """The topology under test and what it takes to check it."""

    def __init__(self, tmp: Path, capsys: pytest.CaptureFixture[str], spec: Path) -> None:
        self.tmp, self.capsys, self.spec = tmp, capsys, spec
        self.password = PASSWORD
        self.writers: list[Writer] = []
        self.lost: set[str] = set()  # acknowledged keys lost within a kill's window (asserted where they were lost)
        self.figures: list[str] = []
        self.started = time.monotonic()

    @property
    def state(self) -> Path:
        return self.spec.parent / ".opsctl" / yaml.safe_load(self.spec.read_text())["name"]

    def data(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.spec.read_text()))

    def write(self, data: dict[str, Any]) -> None:
        self.spec.write_text(yaml.safe_dump(data, sort_keys=False))

    def apply(self) -> float:
        began = time.monotonic()
        code, out, err = run(self.capsys, "apply", "-f", str(self.spec), "--auto-approve")
        assert code == 0, err + out
        return time.monotonic() - began

    def writer(self) -> Writer:
        password = self.password
        writer = Writer(lambda: client_for(self.spec, password), prefix=f"w{len(self.writers) + 1}", pause=0.002)
        self.writers.append(writer.__enter__())
        writer.wait_for_writes(50)
        return writer

    def targets(self) -> dict[str, str]:
        code, out, err = run(self.capsys, "metrics", "targets", "-f", str(self.spec))
        assert code == 0, err
        return {g["labels"]["node"]: g["targets"][0] for g in json.loads(out)}

    def check(self, step: str, took: float, masters: int, nodes: int,
              window: tuple[float, float] | None = None) -> None:
        """The day-2 check: targets answer redis_up 1, status healthy, plan empty, cluster check; the step's writer
        stopped and nothing any writer acknowledged lost (window: the step's writer may lose what was acknowledged
        in it, between a WAIT barrier and a kill)."""
        targets = self.targets()
        assert len(targets) == nodes, targets
        ups = {name: _redis_up(_scrape(target)) for name, target in targets.items()}
        assert ups == dict.fromkeys(targets, "1"), ups
        code, out, err = run(self.capsys, "status", "-f", str(self.spec))
        assert code == 0, err + out
        code, out, err = run(self.capsys, "plan", "-f", str(self.spec))
        assert code == 0, err + out
        check = cluster_check(placed(self.spec).servers[0].endpoint, self.password)
        assert check.returncode == 0 and f"{masters} masters" in check.stdout, check.stdout
        writer = self.writers[-1]
        writer.wait_for_writes(len(writer.acked) + 50)
        writer.stop()
        lost = ""
        if window is not None:
            when = dict(zip(writer.acked, writer.ack_times, strict=True))
            keys = [key for key, _ in writer.lost(self.client())]
            assert all(window[0] < when[k] <= window[1] for k in keys), [(k, when[k] - window[1]) for k in keys]
            self.lost.update(keys)
            inside = sum(1 for t in writer.ack_times if window[0] < t <= window[1])
            lost = f", lost {len(keys)} of the {inside} acknowledged in the {(window[1] - window[0]) * 1000:.0f} ms " \
                   "between the WAIT barrier and the kill"
        missing = self.missing()
        assert missing == [], missing[:10]
        self.figures.append(f"{step}: apply {took:.1f} s, {len(targets)} targets up, writes acknowledged "
                            f"{len(writer.acked)}{lost}, longest write gap {writer.max_gap_ms:.0f} ms")

    def client(self) -> RedisCluster:
        return client_for(self.spec, self.password)

    def missing(self) -> list[str]:
        """Acknowledged writes of every writer so far that are missing or changed (the kill's window excepted)."""
        client = self.client()
        try:
            return [f"{key}: {value!r}" for w in self.writers for key, value in w.lost(client) if key not in self.lost]
        finally:
            client.close()


def _scrape(target: str) -> str:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def masters_by_host(spec: Path, password: str) -> dict[str, list[tuple[str, str]]]:
    """Host name -> (node name, endpoint) of each master serving slots, from a node's CLUSTER NODES."""
    servers = placed(spec).servers
    by_endpoint = {n.endpoint: n for n in servers}
    node = next(n for n in servers if port_accepts(n.address, n.port))
    lines = str(node_client(node.address, node.port, password).execute_command("CLUSTER", "NODES")).splitlines()
    found: dict[str, list[tuple[str, str]]] = {}
    for words in (line.split() for line in lines):
        endpoint = words[1].split("@")[0]
        if "master" in words[2] and len(words) > 8 and endpoint in by_endpoint:
            found.setdefault(by_endpoint[endpoint].host, []).append((by_endpoint[endpoint].name, endpoint))
    return found


def barrier(endpoints: list[str], password: str) -> float:
    """A write on each master, WAITed for by every replica it has (the archiver counts once its segment is stored):
    whatever the master acknowledged before is on each of its replicas. When the barrier began."""
    began = time.monotonic()
    for endpoint in endpoints:
        host, port = endpoint.rsplit(":", 1)
        client = node_client(host, int(port), password)
        links = int(client.info("replication")["connected_slaves"])
        assert write_barrier(client, links), endpoint
    return began


def kill_host(spec: Path, host: str) -> tuple[list[str], float]:
    """SIGKILL every process working in a node folder of host (servers and exporters), delete the folders (the
    machine and its disk gone); the names and when the first kill landed."""
    folders = {name: path.parent for name, path in record_files(spec).items()
               if json.loads(path.read_text())["deployed"]["host"] == host
               and not json.loads(path.read_text()).get("retired")}
    working = working_below(os.path.realpath(folders[next(iter(folders))].parent))
    pids = [pid for folder in folders.values() for pid in working.get(os.path.realpath(folder), [])]
    pids += [int((f / "server.pid").read_text()) for f in folders.values() if (f / "server.pid").exists()]
    killed_at = time.monotonic()
    for pid in sorted(set(pids)):
        os.kill(pid, signal.SIGKILL)
    for folder in folders.values():
        shutil.rmtree(folder)
    return sorted(folders), killed_at


def flagged(survivors: list[Node], password: str, address: str) -> Callable[[], bool | Pending]:
    """Every survivor counts the nodes at the dead address as failing (fail? without a majority of masters)."""
    def check() -> bool | Pending:
        for node in survivors:
            lines = str(node_client(node.address, node.port, password).execute_command("CLUSTER", "NODES"))
            gone = [w for w in (line.split() for line in lines.splitlines()) if w[1].startswith(address + ":")]
            if not gone or not all("fail" in w[2] for w in gone):
                return Pending(f"{node.name} does not flag every node at {address} yet")
        return True
    return check


def exporters_of(rec: dict[str, dict[str, object]]) -> list[tuple[str, int]]:
    return [(str(r["address"]), int(str(r["port"])) + OFFSET) for r in rec.values()]


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_day2(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
              flavor: str) -> None:
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    server_binary(flavor)
    first_spec = make_spec("cluster", flavor, metrics={"exporter": True})
    spec = write_spec(tmp_path, first_spec)
    first_text = spec.read_text()
    archive = tmp_path / "archive"
    life = Life(tmp_path, capsys, spec)
    archivers: list[Archiver] = []
    restored: Path | None = None
    try:
        # 1. created with exporters and a continuous archive, under a writer
        took = life.apply()
        first = records(spec)
        archivers.append(Archiver(spec, archive, tmp_path / "archive-1.jsonl", {PASSWORD_ENV: PASSWORD}))
        life.writer()
        archivers[-1].wait(3, 0.0)
        life.check("create 3x1 (h1-h3)", took, 3, 6)

        # 2. grown: a host, a second replica per shard, a fourth shard
        data = life.data()
        prefix = data["hosts"][0]["address"].rsplit(".", 1)[0]
        data = {**data, "hosts": [*data["hosts"], {"name": "h4", "address": f"{prefix}.4"}],
                "cluster": {**data["cluster"], "masters": 4, "replicas_per_master": 2}}
        life.writer()
        life.write(data)
        took = life.apply()
        life.check("grow to 4x2 (h1-h4)", took, 4, 12)

        # 3. a host drained
        life.writer()
        # The running archiver follows the grow: the new shard said, a new base taken, shard 4's stream read.
        archivers[-1].wait(4, time.time() + 1)
        assert any("became 1, 2, 3, 4" in n and "taking a new base" in n for n in archivers[-1].notes()), \
            archivers[-1].notes()
        data = {**data, "hosts": [h for h in data["hosts"] if h["name"] != "h2"]}
        life.write(data)
        took = life.apply()
        life.check("drain h2", took, 4, 12)

        # 4. the host holding half the masters lost and replaced
        life.writer()
        archivers[-1].wait(4, time.time() + 1)
        by_host = masters_by_host(spec, life.password)
        host = next(h for h, m in by_host.items() if len(m) == 2)
        address = next(h["address"] for h in data["hosts"] if h["name"] == host)
        survivors = [n for n in placed(spec).servers if n.host != host]
        began = barrier([endpoint for _, endpoint in by_host[host]], life.password)
        dead, killed_at = kill_host(spec, host)
        wait_for(flagged(survivors, life.password, address), CONDITION_BOUND, f"the survivors to flag {host}'s nodes",
                 interval=0.05)
        data = {**data, "hosts": [{**h, "address": f"{prefix}.5"} if h["name"] == host else h for h in data["hosts"]]}
        life.write(data)
        code, out, err = run(capsys, "plan", "-f", str(spec), "--output", "json")
        assert code == 2 and [s["kind"] for s in json.loads(out)["steps"]] == ["promote-replica"] * 2, err + out
        took = 0.0
        for _ in range(3):  # the promotions, then (observed again) the new machine's nodes
            took += life.apply()
            code, out, err = run(capsys, "plan", "-f", str(spec))
            if code == 0:
                break
        life.check(f"lose {host} ({len(dead)} nodes, 2 of 4 masters), replaced", took, 4, 12, (began, killed_at))

        # 5. the password rotated: both accepted, clients moved, the old one dropped
        life.writer()
        # The running archiver found the masters promoted onto nodes placed since its start (the drain's members).
        archivers[-1].wait(4, time.time() + 1)
        monkeypatch.setenv(NEW_ENV, NEW)
        data = {**data, "auth": {**data["auth"], "password": {"env": NEW_ENV},
                                 "previous_password": {"env": PASSWORD_ENV}}}
        life.write(data)
        took = life.apply()
        life.writers[-1].stop()
        life.password = NEW
        life.writer()  # clients move to the new password
        assert archivers[-1].stop() == 0  # the archiver too: restarted with the new password's variable
        archivers.append(Archiver(spec, archive, tmp_path / "archive-2.jsonl", {NEW_ENV: NEW}))
        archivers[-1].wait(4, time.time() + 1)
        assert any("resuming the archive" in n for n in archivers[-1].notes()), archivers[-1].notes()
        data = {**data, "auth": {k: v for k, v in data["auth"].items() if k != "previous_password"}}
        life.write(data)
        took += life.apply()
        life.check("rotate the password", took, 4, 12)

        # 6. restored to a time into a new topology. The time is when the archiver read a write (docs/backup.md),
        # after its acknowledgement by the archiver's lag, which a loaded machine stretches past any fixed margin:
        # so T is taken once a barrier on each master is acknowledged by the archiver (it acknowledges what it
        # stored), and every write acknowledged before the barrier was read before T.
        writer = life.writer()
        clock = time.time() - time.monotonic()
        written = time.time()
        barrier([endpoint for pairs in masters_by_host(spec, life.password).values() for _, endpoint in pairs],
                life.password)
        cut = time.time()
        writer.wait_for_writes(len(writer.acked) + 300)
        archivers[-1].wait(4, cut + 1.0)  # read past T
        writer.stop()
        target_spec = make_spec("standalone", flavor)
        target_dir = tmp_path / "restored"
        target_dir.mkdir(mode=0o711)
        restored = write_spec(target_dir, target_spec)
        code, out, err = run(capsys, "apply", "-f", str(restored), "--auto-approve")
        assert code == 0, err + out
        began = time.monotonic()
        code, out, err = run(capsys, "restore", "-f", str(restored), "--from", str(archive), "--to-time", iso(cut),
                             "--auto-approve")
        took = time.monotonic() - began
        assert code == 0 and "verified" in out, err + out
        target = node_client(target_spec["hosts"][0]["address"], target_spec["standalone"]["port"], PASSWORD)
        acked = [(k, v, t + clock) for w in life.writers for (k, v), t in zip(w.acked.items(), w.ack_times,
                                                                              strict=True)]
        before = {k: v for k, v, t in acked if t <= written and k not in life.lost}
        keys = list(before)
        found = [v for i in range(0, len(keys), 1000) for v in target.mget(keys[i:i + 1000])]
        missing = [k for k, v in zip(keys, found, strict=True) if v != before[k]]
        assert missing == [], missing[:10]
        after = [k for k, _, t in acked if t > cut + MARGIN]
        assert after and sum(v is not None for v in target.mget(after[:300])) == 0  # nothing read after T
        life.figures.append(f"restore to T into a standalone: {len(before)} writes acknowledged before T present, "
                            f"none of {len(after)} after it, {took:.1f} s")

        # 7. the archiver stopped, destroy --purge, the first spec applied again
        assert archivers[-1].stop() == 0
        assert archivers[-1].events()[-1]["event"] == "archive-stopped"
        known = records(spec)
        state = life.state
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
        assert code == 0, err + out
        assert sorted(p.name for p in state.iterdir() if p.name.startswith(data["name"] + "-")) == []
        assert [e for e in exporters_of(known) if port_accepts(*e)] == []
        assert working_below(os.path.realpath(state)) == {}
        spec.write_text(first_text)
        life.password = PASSWORD
        life.writers, life.lost = [], set()
        took = life.apply()
        assert records(spec) == first
        life.writer()
        life.check("destroy --purge, apply the first spec", took, 3, 6)
    finally:
        for writer in life.writers:
            writer.stop()
        for archiver in archivers:
            archiver.stop()
        for path in (spec, restored):
            if path is not None:
                main_destroy(path, first_text if path == spec else None)
        capsys.readouterr()
        with os.fdopen(os.dup(2), "w") as err_out:
            print(f"\nday 2 [{flavor}] {time.monotonic() - life.started:.0f} s:\n  " + "\n  ".join(life.figures),
                  file=err_out)


def main_destroy(spec: Path, original: str | None) -> None:
    """destroy --purge with the spec as left (then, when that fails, as first deployed, with either password)."""
    from opsctl.cli.main import main

    if main(["destroy", "-f", str(spec), "--auto-approve", "--purge"]) != 0 and original is not None:
        spec.write_text(original)
        main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
