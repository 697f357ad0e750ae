"""Helpers for the audit tests and bench/audit.py: start rendered nodes, plant a dataset of known content.

No tests here; pytest collects nothing from this module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.net.connector import Connector
from opsctl.net.rawpipe import RawPipe
from opsctl.net.resp import encode
from opsctl.render import NodePaths, render_node
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import CONDITION_BOUND, PASSWORD, NodeClient, admin_for, make_spec, server_binary, write_spec


def node_paths(base: Path, node: Node) -> NodePaths:
    d = base / node.name
    d.mkdir(parents=True, exist_ok=True)
    return NodePaths(str(d), str(d / "redis.conf"), str(d / "users.acl"), str(d / "server.log"), str(d / "server.pid"))


def wait_for(check: Any, timeout: float = CONDITION_BOUND, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.005)
    raise TimeoutError(f"timed out waiting for {what}")


def start_node(loaded: LoadedSpec, node: Node, base: Path, flavor: str) -> Path:
    """Render and start one node (daemonized); returns its pid file."""
    paths = node_paths(base, node)
    for name, text in render_node(loaded, node, paths, reveal=True, daemonize=True).files.items():
        target = Path(paths.conf) if name == "redis.conf" else Path(paths.acl)
        target.write_text(text)
        target.chmod(0o600)
    subprocess.run([server_binary(flavor), paths.conf], check=True, timeout=30, capture_output=True)
    with admin_for(loaded, node, timeout=1.0) as admin:
        wait_for(admin.ping, what=f"{node.name} to answer PING")
    return Path(paths.pid)


def stop_pid(pidfile: Path) -> None:
    with contextlib.suppress(Exception):
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=CONDITION_BOUND, what=f"pid {pid} to exit")


@dataclass
class Fleet:
    spec_file: Path
    loaded: LoadedSpec
    pidfiles: list[Path]

    def admin(self, index: int = 0) -> NodeClient:
        return admin_for(self.loaded, self.loaded.layout.servers[index])

    def stop(self) -> None:
        for pidfile in self.pidfiles:
            stop_pid(pidfile)


@contextlib.contextmanager
def standalone(base: Path, flavor: str, **sections: Any) -> Iterator[Fleet]:
    spec = make_spec("standalone", flavor, hosts=1, **sections)
    spec_file = write_spec(base, spec)
    loaded = read_spec(spec_file)
    fleet = Fleet(spec_file, loaded, [])
    try:
        for node in loaded.layout.servers:
            fleet.pidfiles.append(start_node(loaded, node, base, flavor))
        yield fleet
    finally:
        fleet.stop()


def fill_strings(admin: NodeClient, count: int, prefix: str = "bench:item:", batch: int = 500, depth: int = 20,
                 connector: Connector | None = None) -> None:
    """count small string keys, MSET of `batch` keys, `depth` MSETs per write (through connector: TLS)."""
    with RawPipe(connector or Connector(admin.loaded), admin.node) as pipe:
        mset = pipe.name("MSET")
        done = 0
        while done < count:
            chunks = []
            for _ in range(depth):
                n = min(batch, count - done)
                if n <= 0:
                    break
                args: list[bytes | str | int] = [mset]
                for i in range(done, done + n):
                    args += [f"{prefix}{i}", "v"]
                chunks.append(encode(args))
                done += n
            pipe.send(b"".join(chunks))
            pipe.read(len(chunks))


# --- the planted dataset: known big keys, bad names, keys without TTL, clustered expiries -------------

Command = tuple[Any, ...]
TTL = 7200


def collection(kind: str, key: str, n: int) -> list[Command]:
    if kind == "hash":
        return [("HSET", key, *[x for i in range(n) for x in (f"f{i}", "v")])]
    if kind == "list":
        return [("RPUSH", key, *[f"e{i}" for i in range(n)])]
    if kind == "set":
        return [("SADD", key, *[f"m{i}" for i in range(n)])]
    if kind == "zset":
        return [("ZADD", key, *[x for i in range(n) for x in (i, f"m{i}")])]
    return [("XADD", key, f"1-{i + 1}", "f", "v") for i in range(n)]


def planted_commands(now: int, burst: int = 1200, noise: int = 3000) -> list[Command]:
    """Every planted key has a TTL except nottl:*; the burst keys all expire in one second."""
    cmds: list[Command] = [("SET", "audit:string:big", "x" * 10241), ("SET", "audit:string:ok", "x" * 10240)]
    for kind in ("hash", "list", "set", "zset", "stream"):
        cmds += collection(kind, f"audit:{kind}:big", 5001) + collection(kind, f"audit:{kind}:ok", 5000)
    named = ["nonamespacekey1", "nonamespacekey2", "bad:with space", "bad:new\nline", 'bad:quote"x',
             "long:" + "x" * 200, "style:userName:1", "style:user_name:2", "style:user_name:3"]
    cmds += [("SET", k, "v") for k in named]
    keys_with_ttl = [c[1] for c in cmds]
    cmds += [("EXPIRE", k, TTL + 17 * i) for i, k in enumerate(keys_with_ttl)]
    cmds += [("SET", f"nottl:item:{i}", "v") for i in range(200)]
    at = now + 3 * TTL
    cmds += [c for i in range(burst) for c in (("SET", f"burst:sess:{i}", "v"), ("EXPIREAT", f"burst:sess:{i}", at))]
    cmds += [("SET", f"noise:item:{i}", "v", "EX", _noise_ttl(i)) for i in range(noise)]
    return cmds


def _noise_ttl(i: int) -> int:
    """Spread over a day, never within 10 minutes of the burst's second: `now` is read before the planting, and
    on a loaded machine a noise key set seconds later would otherwise land in the burst's second (1201 seen)."""
    ttl = 3600 + (i * 7919) % 80000
    return ttl + 1200 if abs(ttl - 3 * TTL) < 600 else ttl


def run_commands(pipeline: Any, cmds: list[Command], batch: int = 2000) -> None:
    for start in range(0, len(cmds), batch):
        for cmd in cmds[start:start + batch]:
            pipeline.execute_command(*cmd)
        pipeline.execute()


PLANTED = {
    ("bigkey-string", "audit:string:big"): 10241,
    **{("bigkey-collection", f"audit:{k}:big"): 5001 for k in ("hash", "list", "set", "zset", "stream")},
    ("key-namespace", "(none)"): 2,
    ("key-special-chars", "bad"): 3,
    ("key-length", "long"): 1,
    ("key-case-style", "style"): 1,
    ("ttl-missing", "nottl"): 200,
}


def summary(findings: list[Any]) -> dict[tuple[str, str], int]:
    """(rule, key or prefix) -> size or count, summed over nodes; clustered expiries as ('ttl-clustered', 'keys')."""
    out: dict[tuple[str, str], int] = {}
    for f in findings:
        d = f.data
        if f.rule.startswith("bigkey"):
            subject, value = d["key"], d["size"]
        elif f.rule == "ttl-clustered":
            subject, value = "keys", d["count"]
        elif f.rule == "ttl-missing":
            subject, value = d["prefix"], d["without_ttl"]
        elif "prefix" in d:
            subject, value = d["prefix"], d["count"]
        else:
            subject, value = f.node, 1
        out[(f.rule, subject)] = out.get((f.rule, subject), 0) + value
    return out


# --- a concurrent client in its own process (no GIL sharing with the tool under test) ------------------

_PROBE = r"""
import json, os, sys, time, redis
host, port, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = redis.Redis(host=host, port=port, password=os.environ["PROBE_PASSWORD"])
c.ping()
open(stop + ".ready", "w").close()
samples = []
while not os.path.exists(stop):
    t = time.perf_counter(); c.get("probe:key"); samples.append(time.perf_counter() - t)
samples.sort()
q = lambda p: samples[min(len(samples) - 1, int(p * len(samples)))] * 1000
print(json.dumps({"n": len(samples), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": samples[-1] * 1000}))
"""


class LatencyProbe:
    """GET in a loop from another process; stop() returns n, p50_ms, p99_ms, max_ms."""

    def __init__(self, address: str, port: int, workdir: Path) -> None:
        import json
        import sys

        self._json = json
        self.stop_file = workdir / f"probe-stop-{port}-{time.monotonic_ns()}"
        env = {**os.environ, "PROBE_PASSWORD": PASSWORD}
        self.proc = subprocess.Popen([sys.executable, "-c", _PROBE, address, str(port), str(self.stop_file)],
                                     stdout=subprocess.PIPE, text=True, env=env)
        wait_for(lambda: Path(str(self.stop_file) + ".ready").exists(), what="latency probe to start")

    def stop(self) -> dict[str, float]:
        self.stop_file.touch()
        out, _ = self.proc.communicate(timeout=30)
        return dict(self._json.loads(out))


@contextlib.contextmanager
def cluster(base: Path, flavor: str, **sections: Any) -> Iterator[Fleet]:
    """3 masters + 3 replicas started from rendered configs, joined with redis-cli --cluster create."""
    from tests.support import redis_cli

    spec_file = write_spec(base, make_spec("cluster", flavor, **sections))
    loaded = read_spec(spec_file)
    fleet = Fleet(spec_file, loaded, [])
    try:
        for node in loaded.layout.servers:
            fleet.pidfiles.append(start_node(loaded, node, base, flavor))
        endpoints = [n.endpoint for n in loaded.layout.servers]
        env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
        subprocess.run([redis_cli(), "--cluster", "create", *endpoints, "--cluster-replicas", "1", "--cluster-yes"],
                       env=env, check=True, capture_output=True, timeout=120)
        admins = [admin_for(loaded, n) for n in loaded.layout.servers]
        wait_for(lambda: all("cluster_state:ok" in str(a.raw("CLUSTER", "INFO")) for a in admins), CONDITION_BOUND,
                 "cluster_state:ok on every node")
        for a in admins:
            a.close()
        yield fleet
    finally:
        fleet.stop()


def wait_replicas_synced(fleet: Fleet) -> None:
    """Every replica holds as many keys as its master (the audit scans replicas)."""
    def synced() -> bool:
        for node in fleet.loaded.layout.servers:
            with admin_for(fleet.loaded, node) as admin:
                role = admin.call("ROLE")
                if role[0] == "slave":
                    master_node = fleet.loaded.layout.find(f"{role[1]}:{role[2]}")
                    assert master_node is not None
                    with admin_for(fleet.loaded, master_node) as master:
                        if role[3] != "connected" or admin.client.dbsize() != master.client.dbsize():
                            return False
        return True
    wait_for(synced, CONDITION_BOUND, "replicas in sync")
