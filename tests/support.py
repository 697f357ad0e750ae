"""Shared test helpers: loopback hosts, free ports, spec files, server binaries, redis-cli."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from redis.crc import key_slot

from opsctl.base.errors import OpsctlError
from opsctl.net.connector import DEFAULT_TIMEOUT, Connector
from opsctl.providers.binaries import find_server
from opsctl.spec.layout import EXPORTER_PORT_OFFSET, Node
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import PLAINTEXT_PORT_OFFSET
from tests import netns

if TYPE_CHECKING:
    import redis

PASSWORD_ENV = "OPSCTL_TEST_PASSWORD"
PASSWORD = "test-pw-8c1f4e2a9b7d"


@contextmanager
def server_tmpdir(prefix: str = "opsctl-") -> Iterator[str]:
    """tempfile.TemporaryDirectory that the servers' unprivileged user may pass through (0711): run as root,
    the local provider starts servers as that user (bench scripts; tests use the tmp_path of conftest)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.chmod(tmp, 0o711)
        yield tmp
FLAVORS = {"valkey": "9.1", "redis": "7.0"}
IN_CI = os.environ.get("CI") == "true"


def missing(what: str) -> None:
    """A required part is missing: fail under CI=true, skip elsewhere."""
    if IN_CI:
        pytest.fail(f"required for the test suite but missing: {what}")
    pytest.skip(f"missing: {what}")


def server_binary(flavor: str) -> str:
    try:
        return find_server(flavor, tuple(int(p) for p in FLAVORS[flavor].split(".")), None).path  # type: ignore[arg-type]
    except OpsctlError as exc:
        missing(f"{flavor} {FLAVORS[flavor]} server ({exc.summary})")
        raise


def redis_cli() -> str:
    path = shutil.which("redis-cli")
    if not path:
        missing("redis-cli (apt-get install redis-tools)")
    return str(path)


def loopback_hosts(count: int) -> list[str]:
    """count addresses 127.X.Y.1..count on a random /24, so parallel tests never share an address."""
    x, y = random.randint(64, 250), random.randint(1, 250)
    return [f"127.{x}.{y}.{i}" for i in range(1, count + 1)]


def _free(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


EPHEMERAL_FIRST = 32768
# A bound on a wait for a condition (never a wait by time): a CI machine with two CPU hogs beside the suite took
# over 30 s to start a 6-node apply and a moto server. Reaching it fails the test; meeting the condition ends it.
CONDITION_BOUND = 300.0


DEFAULT_PORTS = frozenset({6379, 26379})  # refused by the spec unless hardening.allow_default_port


def free_base_port(addresses: list[str], count: int, bus: bool = True, taken: Collection[int] = (),
                   bus_offset: int = 10000) -> int:
    """A base port p such that p..p+count-1 (and + bus_offset for the cluster bus) are free on every address, none a
    default port nor in taken (ports the same spec gives other nodes, not bound yet), all below Linux's default
    ephemeral range (32768-60999): a client's or a cluster bus's outgoing connection must never hold a node's port
    when that node (re)starts and binds it."""
    highest = EPHEMERAL_FIRST - 1 - count - (bus_offset if bus else 0)
    for _ in range(200):
        base = random.randint(12000, highest)
        ports = [base + i for i in range(count)]
        if bus:
            ports += [p + bus_offset for p in ports]
        if DEFAULT_PORTS.isdisjoint(ports) and not any(p in taken for p in ports) and \
                all(_free(a, p) for a in addresses for p in ports):
            return base
    raise RuntimeError("no free port range found")


def _beside(ports: range) -> set[int]:
    """The ports another node on the same addresses must not take: ports themselves, and those one offset away (a
    CI run drew a sentinel whose exporter port was a server's). The exporter and plaintext offsets are the same."""
    offset = EXPORTER_PORT_OFFSET
    assert offset == PLAINTEXT_PORT_OFFSET
    return {port + shift for port in ports for shift in (-offset, 0, offset)}


def make_spec(topology: str, flavor: str = "valkey", hosts: int = 3, **sections: Any) -> dict[str, Any]:
    """A minimal valid spec dict on fresh loopback addresses and free ports. sections override/extend."""
    addresses = loopback_hosts(hosts)
    spec: dict[str, Any] = {
        "name": f"t{random.randint(1000, 9999)}",
        "topology": topology,
        "server": {"flavor": flavor, "version": FLAVORS[flavor]},
        "hosts": [{"name": f"h{i + 1}", "address": a} for i, a in enumerate(addresses)],
        "auth": {"mode": "password", "password": {"env": PASSWORD_ENV}},
        "hardening": {"renamed_commands": {"CONFIG": "OPS_CONFIG_T3ST"}},
        "memory": {"maxmemory": "64mb", "policy": "allkeys-lru"},
    }
    if topology == "cluster":
        spec["cluster"] = {"masters": 3, "replicas_per_master": 1,
                           "base_port": free_base_port(addresses, 6 + 4), "node_timeout_ms": 2000}
    elif topology == "standalone":
        spec["standalone"] = {"port": free_base_port(addresses, 1, bus=False)}
    else:
        base = free_base_port(addresses, hosts, bus=False)
        spec["replication"] = {"base_port": base}
        if topology == "sentinel":  # the sentinels share the servers' addresses (a CI run once drew the same port)
            servers = _beside(range(base, base + hosts))
            spec["sentinel"] = {"port": free_base_port(addresses, 1, bus=False, taken=servers),
                                "down_after_ms": 1000,
                                "failover_timeout_ms": 5000}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def write_spec(directory: Path, spec: dict[str, Any], name: str = "topology.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def cluster_check(endpoint: str, password: str = PASSWORD, tls: list[str] | None = None,
                  ) -> subprocess.CompletedProcess[str]:
    """The referee: redis-cli --cluster check, password through REDISCLI_AUTH (never argv); tls: tls_cli_args."""
    env = {**os.environ, "REDISCLI_AUTH": password}
    return subprocess.run([redis_cli(), *(tls or []), "--cluster", "check", endpoint], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def owned_key(client: Any) -> str:
    """A key whose slot the cluster node behind client (a redis-py client of that one node) serves."""
    nodes = client.execute_command("CLUSTER", "NODES")
    mine = next(line for line in (nodes.decode() if isinstance(nodes, bytes) else nodes).splitlines()
                if "myself" in line)
    start = int(mine.split()[8].split("-")[0])
    return next(f"probe:{n}" for n in range(100_000) if key_slot(f"probe:{n}".encode()) == start)


def tls_cli_args(state_dir: Path) -> list[str]:
    """redis-cli options for a fleet with generated certificates (opsctl's client certificate)."""
    folder = state_dir / "tls"
    return ["--tls", "--cacert", str(folder / "ca-bundle.crt"), "--cert", str(folder / "opsctl.crt"),
            "--key", str(folder / "opsctl.key")]


def tls_client_options(state_dir: Path) -> dict[str, Any]:
    """redis-py options for the same."""
    folder = state_dir / "tls"
    return {"ssl": True, "ssl_ca_certs": str(folder / "ca-bundle.crt"), "ssl_certfile": str(folder / "opsctl.crt"),
            "ssl_keyfile": str(folder / "opsctl.key")}


@contextmanager
def bare_server(flavor: str, directory: Path, conf_lines: Sequence[str] = (), password: str | None = None) \
        -> Iterator[Any]:
    """A server with no config of opsctl's (no persistence; no auth unless conf_lines set one) on a fresh loopback
    address, for tests that read what the server itself answers (its command table, its directives) or that need a
    store opsctl did not deploy; a client while it runs. Its settings go in a config file in directory, so a
    password in conf_lines is on no command line."""
    import redis

    from opsctl.base.poll import Pending, wait_for

    address = loopback_hosts(1)[0]
    port = free_base_port([address], 1, bus=False)
    conf = directory / "bare.conf"
    conf.write_text("\n".join([f"bind {address}", f"port {port}", 'save ""', "appendonly no", f"dir {directory}",
                               *conf_lines]) + "\n")
    proc = subprocess.Popen([server_binary(flavor), str(conf)], stdout=subprocess.DEVNULL)
    client = redis.Redis(host=address, port=port, password=password, decode_responses=True)

    def answers() -> bool | Pending:
        try:
            return bool(client.ping())
        except redis.ConnectionError as exc:
            return Pending(str(exc))

    try:
        with suppress(OpsctlError):  # a server that never answers fails the test at its first command
            wait_for(answers, CONDITION_BOUND, f"the {flavor} server at {address}:{port}", 0.02)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


def unix_client(path: str, timeout: float = 60.0) -> Any:
    """A test's own redis-py client of a scratch server on its unix socket (no auth, no TLS; opsctl's handle of it
    speaks raw RESP)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis(unix_socket_path=path, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))


class NodeClient:
    """A test's redis-py client of one node (the connector's route, AUTH and TLS): `call` sends a command under the
    spec's rename, replies come parsed by redis-py; `.client` is the redis-py client itself. opsctl's own code reads
    nodes through its handle (opsctl.net.connection); tests check what the servers say in redis-py's words."""

    def __init__(self, loaded: LoadedSpec, node: Node, client: redis.Redis) -> None:
        self.loaded, self.node, self.client = loaded, node, client
        self.name, self.address, self.port, self.endpoint = node.name, node.address, node.port, node.endpoint

    def command(self, name: str) -> str:
        return self.loaded.command_name(self.node, name)

    def call(self, name: str, *args: Any) -> Any:
        return self.client.execute_command(self.command(name), *args)

    def config_get(self, pattern: str = "*") -> dict[str, str]:
        reply = self.call("CONFIG", "GET", pattern)
        if isinstance(reply, dict):
            return {str(k): str(v) for k, v in reply.items()}
        return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}

    def config_set(self, directive: str, value: str) -> None:
        self.call("CONFIG", "SET", directive, value)

    def raw(self, name: str, *args: Any) -> Any:
        """A command's reply without redis-py's response parsing (INFO and CLUSTER NODES stay text)."""
        return raw_pipeline(self, [(name, *args)])[0]

    def info(self, section: str = "all") -> str:
        return str(self.raw("INFO", section))

    def ping(self) -> bool:
        import redis

        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def raw_pipeline(node: NodeClient, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """commands (renamed as the spec says) in one round trip on one of node's connections; replies unparsed, in
    order, error replies as exception objects; a connection that broke mid-way is dropped, not pooled half read."""
    import redis

    pool = node.client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands([(node.command(c[0]), *c[1:]) for c in commands]))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def admin_for(connector: Connector | LoadedSpec, node: Node, timeout: float = DEFAULT_TIMEOUT,
              decode: bool = True) -> NodeClient:
    """A NodeClient of node over connector; a LoadedSpec gets a direct connector without TLS. decode=False keeps
    replies as bytes (key names are binary-safe that way). opsctl's own code always passes its connector down
    (tests/test_connector.py refuses other calls in opsctl/)."""
    if isinstance(connector, LoadedSpec):
        connector = Connector(connector)
    return NodeClient(connector.loaded, node, connector.client(node, timeout, decode))


def live_lock_owners(loaded: LoadedSpec) -> set[str]:
    """The owners of live topology lock markers on every server (a node that is down holds none)."""
    import redis

    from opsctl.net.quorum import parse_markers

    owners = set()
    for node in loaded.layout.servers:
        try:
            with admin_for(loaded, node) as admin:
                listing = admin.call("CLIENT", "LIST")
        except redis.ConnectionError:
            continue  # a node a killed run left stopped holds no marker
        owners |= {m.owner for m in parse_markers(str(listing), node.name) if m.live}
    return owners


def lease_lapsed(loaded: LoadedSpec, timeout: float) -> None:
    """Until no live lock marker is left on any server: a stopped or hung holder's lease ran out (its markers were
    not renewed for longer than the lease, so its own clock counts a pause longer than the lease too)."""
    from opsctl.base.poll import wait_for

    wait_for(lambda: not live_lock_owners(loaded) or None, timeout, "the held lock's markers to lapse",
             0.1, last_reason=lambda: f"live markers of {sorted(live_lock_owners(loaded))}")


def netns_lab(count: int) -> Iterator[netns.Lab]:
    """A network-namespace lab of count hosts for a module fixture (`yield from netns_lab(3)`), removed afterwards
    even when a test failed; a machine that cannot host one is a missing part (fails under CI=true)."""
    why = netns.unavailable()
    if why:
        missing(why)
    try:
        created = netns.up(count)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        missing(f"a network-namespace lab ({exc})")
        raise
    try:
        yield created
    finally:
        netns.down(created.id)


def write_barrier(client: Any, replicas: int) -> bool:
    """A write to one of the master's own slots (the others answer MOVED), then WAIT: whether every one of replicas
    acknowledged it within CONDITION_BOUND, so every write the master acknowledged before is on them. WAITed for
    a second at a time: a replica under load (an archiver acknowledges once its segment is stored) takes what it
    takes."""
    import redis

    for n in range(1000):
        try:
            client.set(f"barrier:{{{n}}}", "1")
            break
        except redis.ResponseError:
            continue
    deadline = time.monotonic() + CONDITION_BOUND
    while int(client.execute_command("WAIT", replicas, 1000)) < replicas:
        if time.monotonic() > deadline:
            return False
    return True


_STARTED: list[subprocess.Popen[str]] = []  # long-running opsctl processes tests started (migrate, follow)


def started(proc: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """proc, remembered so that kill_started() ends it if the test leaves it running."""
    _STARTED.append(proc)
    return proc


def kill_started() -> None:
    """Every process started() that still runs, killed (SIGKILL: a teardown, not a stop under test), before a
    failed test's topologies are destroyed under it."""
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
