"""opsctl migrate against real servers: a standalone Redis 7.0 under a writer moved into a 3-master Valkey 9.1
cluster and cut over from another terminal (every acknowledged write in the target, writes after the fence
refused, the pause measured); a 3-master cluster into 5 masters with --cutover auto; a migrate SIGKILLed
mid-stream resumed without a second full copy; a resume past the backlog refused; the edges refused at their
offset; a source failed over by hand and a Sentinel source whose master is SIGKILLed, both followed; TLS and ACL
users on both sides (Redis 7.0: the Valkey wheel has no TLS) with no secret in the output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import redis

from opsctl.base.poll import wait_for
from opsctl.spec.load import LoadedSpec
from opsctl.state.localdirs import state_dir_for
from tests.lifecycle import deployed, run
from tests.support import CONDITION_BOUND, PASSWORD, cluster_check, started
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

TARGET = ("cluster", "valkey", {"cluster": {"masters": 3, "replicas_per_master": 0}})
SOURCE = ("standalone", "redis", {})


@contextmanager
def pair(tmp_path: Path, capsys: pytest.CaptureFixture[str], source: tuple[str, str, dict[str, Any]] = SOURCE,
         target: tuple[str, str, dict[str, Any]] = TARGET) -> Iterator[tuple[Path, LoadedSpec, Path, LoadedSpec]]:
    with ExitStack() as stack:
        found = []
        for name, (topology, flavor, sections) in (("src", source), ("dst", target)):
            folder = tmp_path / name
            folder.mkdir()
            found.append(stack.enter_context(deployed(folder, capsys, topology, flavor, **sections)))
        (s, s_loaded), (t, t_loaded) = found
        yield s, s_loaded, t, t_loaded


def source_client(loaded: LoadedSpec) -> redis.Redis:
    node = next(n for n in loaded.layout.servers if n.role == "master")
    return redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True)


class Migrate:
    """opsctl migrate as a subprocess, its JSON events read as they come."""

    def __init__(self, target: Path, source: Path | None, *extra: str, env: dict[str, str] | None = None) -> None:
        """source None: the source is in extra (--from-endpoints ...); env: added to opsctl's environment."""
        argv = [sys.executable, "-m", "opsctl.cli.main", "migrate", "-f", str(target),
                *(["--from", str(source)] if source else []), "--auto-approve", "--output", "json", *extra]
        self.proc = started(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env={**os.environ, **(env or {})}))
        self.events: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with suppress(ValueError):
                self.events.append(json.loads(line))

    def streaming(self, timeout: float = CONDITION_BOUND, after: int = 0) -> dict[str, Any]:
        """The first lag report (among the events from `after` on: len(events) at a moment) with every shard
        streaming."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lags = [e for e in self.events[after:] if e.get("event") == "migrate-lag"]
            if lags and all(s["phase"] == "stream" for s in lags[-1]["shards"].values()):
                return lags[-1]
            assert self.proc.poll() is None, self.stderr()
            time.sleep(0.05)
        raise AssertionError(f"not streaming after {timeout}s: {self.events[-3:]}")

    def wait(self, timeout: float = CONDITION_BOUND) -> int:
        code = self.proc.wait(timeout)
        self.thread.join(5)
        return code

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""

    def done(self) -> dict[str, Any]:
        return next(e for e in self.events if e.get("event") == "cutover-done")


def carried(left_ms: int, ttl_ms: int, set_between: tuple[float, float], slack_ms: float = 1000.0) -> bool:
    """A TTL carried as a point in time, not restarted by the copy: what is left is the TTL less the time since the
    key was set (somewhere between the two monotonic times), within slack_ms (the servers' clocks as the copy
    measured them). A loaded machine stretches the run, so no fixed floor holds."""
    now = time.monotonic()
    lived_most, lived_least = ((now - at) * 1000 for at in set_between)
    return ttl_ms - lived_most - slack_ms < left_ms <= ttl_ms - lived_least + slack_ms


def fill(client: redis.Redis, count: int = 2000) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.set(f"s:{i}", f"v{i}")
        if i % 10 == 0:
            pipe.pexpire(f"s:{i}", 600_000)
    for i in range(20):
        pipe.hset(f"h:{i}", mapping={f"f{j}": j for j in range(i + 1)})
        pipe.rpush(f"l:{i}", *range(i + 1))
    pipe.execute()


def test_standalone_redis_into_a_valkey_cluster_with_a_writer_and_a_cutover(tmp_path, capsys) -> None:
    with pair(tmp_path, capsys) as (s, s_loaded, t, t_loaded):
        src = source_client(s_loaded)
        filling = time.monotonic()
        fill(src)
        filled = time.monotonic()
        with Writer(lambda: source_client(s_loaded)) as writer:
            writer.wait_for_writes(500)
            migrate = Migrate(t, s)
            migrate.streaming()
            src.execute_command("INCR", "counter")  # not idempotent: applied exactly once
            setting = time.monotonic()
            src.set("ttl:rel", "x", ex=300)
            set_at = time.monotonic()
            writer.wait_for_more(300)  # the stream under the writer
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 0 and "cutover done" in out, out + err
            writer.wait_for_refusal()  # writes after the fence: refused
        assert migrate.wait() == 0, migrate.stderr()
        done = migrate.done()
        assert done["ok"] and done["source_keys"] == done["target_keys"], done
        assert 0 < done["pause_s"] < 5, done
        with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
            src.set("after-fence", 1)
        assert writer.errors and all("NOREPLICAS" in e for e in writer.errors), writer.errors[:3]
        dst = cluster_client(t_loaded)
        assert writer.verify(dst) == [], "acknowledged writes missing in the target"
        assert dst.get("counter") == "1" and dst.get("s:5") == "v5" and dst.lrange("l:3", 0, -1) == list("0123")
        assert carried(dst.pttl("ttl:rel"), 300_000, (setting, set_at)), dst.pttl("ttl:rel")
        assert carried(dst.pttl("s:10"), 600_000, (filling, filled)), dst.pttl("s:10")
        assert not [k for k in dst.scan_iter("opsctl-migrate:*")], "markers left on the target"
        assert cluster_check(f"{t_loaded.layout.servers[0].address}:{t_loaded.layout.servers[0].port}").returncode \
            == 0
        with capsys.disabled():
            print(f"\nmigrate: {len(writer.acked)} acked writes, pause {done['pause_s']}s, caught up after "
                  f"{done['caught_up_s']}s, {done['target_keys']} keys")


def test_a_migrate_killed_twice_mid_stream_resumes_without_a_second_full_copy(tmp_path, capsys) -> None:
    """SIGKILL while INCR and RPUSH stream in, twice: each resumed run continues by partial resync and applies every
    command exactly once (a replayed INCR would show in the counter, a replayed RPUSH in the list)."""
    with pair(tmp_path, capsys) as (s, s_loaded, t, t_loaded):
        src = source_client(s_loaded)
        fill(src, 500)
        bumps = 0

        def bump(count: int) -> None:
            nonlocal bumps
            for _ in range(count):
                src.execute_command("INCR", "counter")
                src.rpush("list", bumps)
                bumps += 1
        with Writer(lambda: source_client(s_loaded)) as writer:
            migrate = Migrate(t, s)
            migrate.streaming()
            syncs = int(src.info("stats")["sync_full"])
            for _ in range(2):
                busy = threading.Thread(target=bump, args=(400,))
                started = bumps
                busy.start()
                wait_for(lambda started=started: bumps >= started + 50 or None, CONDITION_BOUND, "the bumps under way")
                migrate.proc.send_signal(signal.SIGKILL)  # mid-stream, commands in flight
                migrate.wait()
                busy.join()
                migrate = Migrate(t, s)
                migrate.streaming()
            migrate.proc.send_signal(signal.SIGKILL)
            migrate.wait()
            bump(100)
            migrate = Migrate(t, s, "--cutover", "auto")
            assert migrate.wait() == 0, migrate.stderr()
        assert int(src.info("stats")["sync_full"]) == syncs, "a resumed run took a second full copy"
        assert int(src.info("stats")["sync_partial_ok"]) >= 3
        assert migrate.done()["ok"], migrate.done()
        dst = cluster_client(t_loaded)
        assert writer.verify(dst) == []
        assert dst.get("counter") == str(bumps) and dst.lrange("list", 0, -1) == [str(i) for i in range(bumps)]


def test_a_resume_past_the_backlog_says_it_must_start_over(tmp_path, capsys) -> None:
    with pair(tmp_path, capsys) as (s, s_loaded, t, _t_loaded):
        src = source_client(s_loaded)
        fill(src, 100)
        migrate = Migrate(t, s)
        migrate.streaming()
        migrate.proc.send_signal(signal.SIGKILL)
        migrate.wait()
        src.execute_command(s_loaded.command_name(s_loaded.layout.servers[0], "CONFIG"), "SET", "repl-backlog-size",
                            "16384")
        for i in range(300):
            src.set(f"fill:{i}", "x" * 10_000)
        code, out, err = run(capsys, "migrate", "-f", str(t), "--from", str(s), "--auto-approve")
        assert code == 3 and "must start over: backlog overrun" in err, out + err


EDGES = [("FLUSHALL", "FLUSHALL"), ("SELECT 3", "a cluster has only database 0"), ("MULTI", "touches keys on")]


def test_the_edges_stop_at_their_offset(tmp_path, capsys) -> None:
    """One pair of topologies for every edge: after each refusal the journal goes and both sides are emptied."""
    flushable = {"hardening": {"disabled_commands": ["KEYS"]}}
    target = (TARGET[0], TARGET[1], {**TARGET[2], **flushable})
    with pair(tmp_path, capsys, ("standalone", "redis", flushable), target) as (s, s_loaded, t, t_loaded):
        src, dst = source_client(s_loaded), cluster_client(t_loaded)
        node = s_loaded.layout.servers[0]
        for edge, expect in EDGES:
            src.flushall()
            for master in dst.get_primaries():
                dst.get_redis_connection(master).flushall()
            (state_dir_for(t_loaded, None) / "migrate-journal.json").unlink(missing_ok=True)
            fill(src, 100)
            migrate = Migrate(t, s)
            migrate.streaming()
            src.set("before-edge", 1)
            if edge == "MULTI":
                with src.pipeline(transaction=True) as pipe:
                    pipe.set("a", 1).set("b", 2).set("c", 3).set("d", 4).execute()
            elif edge == "SELECT 3":
                redis.Redis(host=node.address, port=node.port, password=PASSWORD, db=3).set("x", 1)
            else:
                src.execute_command("FLUSHALL")
            assert migrate.wait() == 3, (edge, migrate.events[-2:])
            err = migrate.stderr()
            assert expect in err and "replication offset" in err, err
            assert dst.get("before-edge") == "1", edge


def test_a_three_master_cluster_into_five_masters_cut_over_by_itself(tmp_path, capsys) -> None:
    source = ("cluster", "valkey", {"cluster": {"masters": 3, "replicas_per_master": 0}})
    target = ("cluster", "valkey", {"cluster": {"masters": 5, "replicas_per_master": 0}})
    with pair(tmp_path, capsys, source, target) as (s, s_loaded, t, t_loaded):
        src = cluster_client(s_loaded)
        for i in range(1000):
            src.set(f"c:{i}", i)
        with Writer(lambda: cluster_client(s_loaded)) as writer:
            writer.wait_for_writes(200)
            migrate = Migrate(t, s, "--cutover", "auto", "--lag-bound", "0.5")
            assert migrate.wait() == 0, migrate.stderr()
            writer.wait_for_refusal()  # a write reached the fenced source after the cutover
        done = migrate.done()
        assert done["ok"] and len(done["final_offsets"]) == 3 and len(done["point_to"]) == 5, done
        dst = cluster_client(t_loaded)
        assert writer.verify(dst) == [] and dst.get("c:999") == "999"
        assert writer.errors, "no write reached the fenced source after the cutover"
        node = t_loaded.layout.servers[0]
        assert cluster_check(f"{node.address}:{node.port}").returncode == 0


def test_a_source_failover_mid_stream_is_followed(tmp_path, capsys) -> None:
    source = ("replication", "redis", {"hosts": 2})
    with pair(tmp_path, capsys, source, TARGET) as (s, s_loaded, t, t_loaded):
        old, new = s_loaded.layout.servers[0], s_loaded.layout.servers[1]
        old_c, new_c = (redis.Redis(host=n.address, port=n.port, password=PASSWORD, decode_responses=True)
                        for n in (old, new))
        config = s_loaded.command_name(old, "CONFIG")
        replicaof = s_loaded.command_name(old, "REPLICAOF")
        with Writer(lambda: old_c) as before:
            migrate = Migrate(t, s)
            migrate.streaming()
            before.wait_for_more(300)  # writes streamed from the first master
        offset = int(old_c.info("replication")["master_repl_offset"])
        deadline = time.monotonic() + 10
        while int(new_c.info("replication")["master_repl_offset"]) < offset:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stats = new_c.info("stats")
        new_c.execute_command(replicaof, "NO", "ONE")
        new_c.execute_command(config, "SET", "min-replicas-to-write", "0")
        old_c.execute_command(replicaof, new.address, new.port)
        with Writer(lambda: new_c, prefix="after") as after:
            after.wait_for_writes(300)
            mark = len(migrate.events)
            after.wait_for_more(300)  # writes on the new master
            migrate.streaming(after=mark)  # followed: a lag report since, every shard streaming
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 0, out + err
        assert migrate.wait() == 0, migrate.stderr()
        now = new_c.info("stats")
        assert now["sync_full"] == stats["sync_full"], "the promoted replica had to send a full copy"
        assert now["sync_partial_ok"] > stats["sync_partial_ok"]
        dst = cluster_client(t_loaded)
        assert before.verify(dst) == [] and after.verify(dst) == []


def test_tls_and_acl_users_on_both_sides_and_no_secret_in_the_output(tmp_path, capsys) -> None:
    from tests.support import PASSWORD_ENV, tls_client_options

    acl = {"auth": {"mode": "acl", "password": {"env": PASSWORD_ENV}}}
    source = ("standalone", "redis", {**acl, "tls": {"enabled": True, "generate": True}})
    target = ("cluster", "redis", {**acl, "tls": {"enabled": True, "generate": True},
                                    "cluster": {"masters": 3, "replicas_per_master": 0}})
    with pair(tmp_path, capsys, source, target) as (s, s_loaded, t, t_loaded):
        node = s_loaded.layout.servers[0]

        def client() -> redis.Redis:
            return redis.Redis(host=node.address, port=node.port, username=s_loaded.spec.auth.admin_user,
                               password=PASSWORD, decode_responses=True,
                               **tls_client_options(state_dir_for(s_loaded, None)))
        fill(client(), 200)
        with Writer(client) as writer:
            migrate = Migrate(t, s, "--cutover", "auto")
            assert migrate.wait() == 0, migrate.stderr()
        assert migrate.done()["ok"] and PASSWORD not in json.dumps(migrate.events) + migrate.stderr()
        dst = cluster_client(t_loaded, username=t_loaded.spec.auth.admin_user,
                             **tls_client_options(state_dir_for(t_loaded, None)))
        assert writer.verify(dst) == [] and dst.get("s:7") == "v7"


def test_a_sentinel_source_whose_master_dies_mid_stream_is_followed(tmp_path, capsys) -> None:
    from opsctl.base.poll import wait_for

    with pair(tmp_path, capsys, ("sentinel", "redis", {}), TARGET) as (s, s_loaded, t, t_loaded):
        servers = s_loaded.layout.servers

        def client(node: Any) -> redis.Redis:
            return redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True,
                               socket_timeout=2.0)

        def master_now() -> Any:
            for node in servers:
                with suppress(redis.RedisError, OSError):
                    if client(node).execute_command("ROLE")[0] == "master":
                        return node
            return None

        old = master_now()
        with Writer(lambda: client(old)) as before:
            migrate = Migrate(t, s)
            migrate.streaming()
            before.wait_for_more(300)  # writes streamed from the first master
        offset = int(client(old).info("replication")["master_repl_offset"])
        replicas = [n for n in servers if n != old]
        wait_for(lambda: all(int(client(n).info("replication")["master_repl_offset"]) >= offset for n in replicas)
                 or None, CONDITION_BOUND, "the replicas to catch up")
        os.kill(int(client(old).info("server")["process_id"]), signal.SIGKILL)
        new = wait_for(lambda: (n if (n := master_now()) not in (None, old) else None), CONDITION_BOUND,
                       "Sentinel's failover")
        with Writer(lambda: client(new), prefix="after") as after:
            after.wait_for_writes(300)
            mark = len(migrate.events)
            after.wait_for_more(300)  # writes on the new master
            migrate.streaming(after=mark)  # followed: a lag report since, every shard streaming
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 0, out + err
        assert migrate.wait() == 0, migrate.stderr()
        dst = cluster_client(t_loaded)
        assert before.verify(dst) == [] and after.verify(dst) == []
