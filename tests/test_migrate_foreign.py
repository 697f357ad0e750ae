"""opsctl migrate from a store opsctl did not deploy (issue 26, item 1): a standalone Redis 7.0 the test starts
itself with requirepass, given as --from-endpoints with --from-password-file, moved under a writer into a
3-master Valkey 9.1 cluster and cut over: every acknowledged write in the target, verification OK, redis-cli's
check passes, and the password appears in no output and on no child's command line. Then a 3x1 Valkey cluster
and a Redis replication topology given only by one replica's endpoint: every shard found and followed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.lifecycle import deployed, run
from tests.support import bare_server, cluster_check
from tests.test_migrate_live import TARGET, Migrate, fill
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

SECRET = "foreign-pw-5e0b7c1d93a4"


@contextmanager
def foreign_redis(folder: Path) -> Iterator[tuple[str, int]]:
    """A Redis 7.0 of the test's own (not opsctl's), password in its config file, not on its command line."""
    with bare_server("redis", folder, [f"requirepass {SECRET}", "repl-backlog-size 64mb"], SECRET) as client:
        where = client.connection_pool.connection_kwargs
        yield str(where["host"]), int(where["port"])


def password_file(folder: Path, secret: str = SECRET) -> Path:
    """The source's password in a 0600 file (what --from-password-file names)."""
    path = folder / "source.pw"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


def children_argv() -> str:
    """Every process's command line on the machine (opsctl, the scratch servers it started, ...)."""
    return subprocess.run(["ps", "-e", "-o", "args="], capture_output=True, text=True, check=False).stdout


def test_a_standalone_redis_given_by_endpoints_into_a_valkey_cluster(tmp_path, capsys) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    secret_file = password_file(tmp_path)
    topology, flavor, sections = TARGET
    with foreign_redis(tmp_path / "src") as (address, port), \
            deployed(tmp_path / "dst", capsys, topology, flavor, **sections) as (t, t_loaded):

        def source() -> redis.Redis:
            return redis.Redis(host=address, port=port, password=SECRET, decode_responses=True)
        src = source()
        fill(src)
        with Writer(source) as writer:
            writer.wait_for_writes(300)
            migrate = Migrate(t, None, "--from-endpoints", f"{address}:{port}", "--from-password-file",
                              str(secret_file))
            migrate.streaming()
            assert SECRET not in children_argv(), "the source's password on a command line"
            src.execute_command("INCR", "counter")
            writer.wait_for_more(500)  # the stream under the writer
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 0 and "cutover done" in out, out + err
            writer.wait_for_refusal()  # writes after the fence: refused
        assert migrate.wait() == 0, migrate.stderr()
        done = migrate.done()
        assert done["ok"] and done["source_keys"] == done["target_keys"], done
        assert writer.errors and all("NOREPLICAS" in e for e in writer.errors), writer.errors[:3]
        dst = cluster_client(t_loaded)
        assert writer.verify(dst) == [], "acknowledged writes missing in the target"
        assert dst.get("counter") == "1" and dst.get("s:5") == "v5"
        node = t_loaded.layout.servers[0]
        assert cluster_check(f"{node.address}:{node.port}").returncode == 0
        shown = "".join(str(e) for e in migrate.events) + migrate.stderr() + out + err
        assert SECRET not in shown, "the source's password in the output"


UNRENAMED = {"hardening": {"renamed_commands": {}, "rename_takeover_commands": False}}


@pytest.mark.parametrize("source", [
    ("cluster", "valkey", {"cluster": {"masters": 3, "replicas_per_master": 1}, **UNRENAMED}),
    ("replication", "redis", UNRENAMED),
])
def test_a_cluster_or_replication_source_found_from_one_endpoint(tmp_path, capsys, source) -> None:
    """Deployed here, but given only as one replica's endpoint and a password variable: the members are found on
    the servers (CLUSTER NODES, or the replica's master and its replicas), the stream follows every shard."""
    from tests.support import PASSWORD, PASSWORD_ENV
    from tests.test_migrate_live import pair

    with pair(tmp_path, capsys, source, TARGET) as (_, s_loaded, t, t_loaded):
        replica = next(n for n in s_loaded.layout.servers if n.role == "replica")
        if source[0] == "cluster":
            src = cluster_client(s_loaded)
        else:
            master = next(n for n in s_loaded.layout.servers if n.role == "master")
            src = redis.Redis(host=master.address, port=master.port, password=PASSWORD, decode_responses=True)
        for i in range(500):
            src.set(f"s:{i}", f"v{i}")
        migrate = Migrate(t, None, "--from-endpoints", replica.endpoint, "--from-password-env", PASSWORD_ENV)
        lag = migrate.streaming()
        assert len(lag["shards"]) == len(s_loaded.layout.shards), lag
        mark = len(migrate.events)
        src.incr("counter")
        migrate.streaming(after=mark)  # a lag report after the write, every shard streaming
        code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
        assert code == 0 and "cutover done" in out, out + err
        assert migrate.wait() == 0, migrate.stderr()
        done = migrate.done()
        assert done["ok"] and done["source_keys"] == done["target_keys"] == 501, done
        dst = cluster_client(t_loaded)
        assert dst.get("counter") == "1" and dst.get("s:499") == "v499"


def test_a_tls_source_given_by_endpoints_with_its_ca_and_a_client_certificate(tmp_path, capsys) -> None:
    """--from-tls-ca/--from-tls-cert/--from-tls-key: a Redis 7.0 that speaks TLS only and asks clients for a
    certificate (here one opsctl deployed, its files named by path as for any store) is found, migrated and cut
    over; without the TLS options it is refused as not answering, and nothing is written."""
    from opsctl.state.localdirs import state_dir_for
    from tests.support import PASSWORD, tls_client_options
    from tests.test_migrate_live import pair

    source = ("standalone", "redis", {**UNRENAMED, "tls": {"enabled": True, "generate": True}})
    with pair(tmp_path, capsys, source) as (_, s_loaded, t, t_loaded):
        node = s_loaded.layout.servers[0]
        options = tls_client_options(state_dir_for(s_loaded, None))
        fill(redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True, **options),
             300)
        argv = ("--from-endpoints", node.endpoint, "--from-password-file", str(password_file(tmp_path, PASSWORD)))
        plain = Migrate(t, None, *argv)
        assert plain.wait() == 1 and "no endpoint of the source answers" in plain.stderr(), plain.stderr()
        tls = ("--from-tls-ca", options["ssl_ca_certs"], "--from-tls-cert", options["ssl_certfile"],
               "--from-tls-key", options["ssl_keyfile"])
        migrate = Migrate(t, None, *argv, *tls, "--cutover", "auto")
        assert migrate.wait() == 0, migrate.stderr()
        done = migrate.done()
        assert done["ok"] and done["source_keys"] == done["target_keys"] >= 300, done
        assert cluster_client(t_loaded).get("s:5") == "v5"
        assert PASSWORD not in json.dumps(migrate.events) + migrate.stderr() + plain.stderr()
