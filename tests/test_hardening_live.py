"""The hardened config, proven through the real servers (Valkey 9.1 and Redis 7.0, password and ACL modes).

Each server is rendered with real secrets (a password full of quoting hazards), started with its own binary
(it daemonizes), asked what it runs with, and shut down in a finalizer even when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from opsctl.observe.replies import config_equal, is_config_directive
from opsctl.render import NodePaths, render_node
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec, load_spec, make_resolver
from opsctl.state.safefs import write_private
from tests.support import PASSWORD_ENV, NodeClient, admin_for, make_spec, server_binary

pytestmark = pytest.mark.integration

TRICKY = "Qu\"ote\\back$lash#x'y!{}"  # what the server reads must be this, quotes and backslash included
APP_ENV, APP_PASSWORD = "OPSCTL_LIVE_APP_PASSWORD", "app-live-pw-7c2e90d4"
RENAMED_CONFIG = "OPS_CONFIG_L1VE"
DISABLED = ("FLUSHALL", "FLUSHDB", "KEYS")
# Secrets: compared on their own in test_secrets_are_read_exactly_as_written.
NOT_COMPARED = {"requirepass", "masterauth"}
MODES = [(flavor, mode) for flavor in ("valkey", "redis") for mode in ("password", "acl")]


@dataclass
class Live:
    loaded: LoadedSpec
    node: Node
    admin: NodeClient
    rendered: dict[str, str]
    sections: tuple[tuple[str, str], ...]

    def client(self, username: str, password: str) -> redis.Redis:
        return redis.Redis(host=self.node.address, port=self.node.port, username=username, password=password,
                           socket_timeout=5, decode_responses=True, protocol=2)

    def anonymous(self, *args: str) -> str:
        """One command on a fresh connection that never authenticated; the first reply line."""
        with socket.create_connection((self.node.address, self.node.port), timeout=5) as sock:
            parts = [f"*{len(args)}\r\n", *(f"${len(a.encode())}\r\n{a}\r\n" for a in args)]
            sock.sendall("".join(parts).encode())
            return sock.makefile("rb").readline().decode().rstrip("\r\n")


def load(spec: dict[str, object]) -> LoadedSpec:
    secrets = {PASSWORD_ENV: TRICKY, APP_ENV: APP_PASSWORD}
    return load_spec(yaml.safe_dump(spec), "live.yaml", make_resolver(secrets, lambda _name: None))


def auth_section(mode: str) -> dict[str, object]:
    auth: dict[str, object] = {"mode": mode, "password": {"env": PASSWORD_ENV}}
    if mode == "acl":
        auth["users"] = [{"name": "app", "password": {"env": APP_ENV}, "rules": "~app:* &* +@all -@dangerous"}]
    return auth


def paths_in(directory: Path, conf: str) -> NodePaths:
    return NodePaths(dir=str(directory), conf=str(directory / conf), acl=str(directory / "users.acl"),
                     log=str(directory / "server.log"), pid=str(directory / "server.pid"))


def wait_until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not answer in time")
        time.sleep(0.005)


def stop(admin: NodeClient, pidfile: Path) -> None:
    """SHUTDOWN NOSAVE (raw: redis-py would retry the dropped connection), then SIGTERM the pidfile's pid."""
    with contextlib.suppress(redis.RedisError, OSError):
        admin.raw("SHUTDOWN", "NOSAVE")
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), 5)
    admin.close()


def start(request: pytest.FixtureRequest, loaded: LoadedSpec, node: Node, directory: Path) -> Live:
    conf = "sentinel.conf" if node.is_sentinel else "redis.conf"
    paths = paths_in(directory, conf)
    rendered = render_node(loaded, node, paths, reveal=True, daemonize=True)
    for name, text in rendered.files.items():
        write_private(directory / name, text)
    admin = admin_for(loaded, node)
    request.addfinalizer(lambda: stop(admin, Path(paths.pid)))
    args = [server_binary(loaded.spec.server.flavor), paths.conf, *(["--sentinel"] if node.is_sentinel else [])]
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    log = Path(paths.log).read_text() if Path(paths.log).exists() else ""
    assert done.returncode == 0, f"{args[0]} refused its config:\n{done.stdout}{done.stderr}{log[-2000:]}"
    try:
        wait_until(admin.ping)
    except TimeoutError:
        pytest.fail(f"{node.name} did not answer; log:\n{Path(paths.log).read_text()[-2000:]}")
    sections = tuple(d for s in rendered.sections for d in s.directives)
    return Live(loaded, node, admin, rendered.files, sections)


@pytest.fixture(scope="module", params=MODES, ids=[f"{f}-{m}" for f, m in MODES])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    flavor, mode = request.param
    spec = make_spec("standalone", flavor, hosts=1, auth=auth_section(mode),
                     hardening={"renamed_commands": {"CONFIG": RENAMED_CONFIG}})
    loaded = load(spec)
    yield start(request, loaded, loaded.layout.nodes[0], tmp_path_factory.mktemp(f"{flavor}-{mode}"))


def error_of(call: Callable[..., object], *args: object) -> str:
    with pytest.raises(redis.ResponseError) as caught:
        call(*args)
    return str(caught.value)


def test_unauthenticated_clients_are_refused(live: Live) -> None:
    for command in (("GET", "k"), ("SET", "k", "v"), (RENAMED_CONFIG, "GET", "dir"), ("PING",)):
        assert live.anonymous(*command).startswith("-NOAUTH"), command


def test_wrong_password_is_refused(live: Live) -> None:
    user = live.loaded.spec.auth.admin_user if live.loaded.spec.auth.mode == "acl" else "default"
    assert live.anonymous("AUTH", user, "wrong-password-123").startswith("-WRONGPASS")
    assert live.anonymous("AUTH", user, TRICKY) == "+OK"


def test_disabled_commands_are_unknown(live: Live) -> None:
    for command in DISABLED:
        args = ("*",) if command == "KEYS" else ()
        assert "unknown command" in error_of(live.admin.client.execute_command, command, *args)


def test_config_answers_only_under_its_new_name(live: Live) -> None:
    assert live.admin.command("CONFIG") == RENAMED_CONFIG
    assert live.admin.config_get("port") == {"port": str(live.node.port)}
    assert "unknown command" in error_of(lambda: live.admin.client.execute_command("CONFIG", "GET", "port"))


def test_protected_configs_cannot_be_set(live: Live) -> None:
    """The `CONFIG SET dir` + dbfilename attack (write ~/.ssh/authorized_keys) is refused."""
    for directive, value in (("dir", "/tmp"), ("dbfilename", "authorized_keys")):
        assert "protected config" in error_of(live.admin.config_set, directive, value)
    assert live.admin.config_get("dir")["dir"] != "/tmp"


def test_hardened_values_are_in_effect(live: Live) -> None:
    got = live.admin.config_get("*")
    expected = {"appendonly": "yes", "appendfsync": "everysec", "aof-use-rdb-preamble": "yes",
                "save": "900 1 300 10 60 10000", "maxmemory": str(64 * 1024 * 1024),
                "maxmemory-policy": "allkeys-lru", "protected-mode": "yes", "enable-protected-configs": "no",
                "enable-debug-command": "no", "enable-module-command": "no",
                **{name: "yes" for name in ("lazyfree-lazy-eviction", "lazyfree-lazy-expire",
                                            "lazyfree-lazy-server-del", "lazyfree-lazy-user-del",
                                            "replica-lazy-flush")}}
    if live.loaded.spec.server.flavor == "valkey":
        expected["hide-user-data-from-log"] = "yes"
    assert {k: got.get(k) for k in expected} == expected


def test_every_rendered_directive_is_in_effect(live: Live) -> None:
    """The rendered sections and CONFIG GET agree on every directive (the comparison opsctl audit makes)."""
    got = live.admin.config_get("*")
    for name, value in live.sections:
        if not is_config_directive(name) or name in NOT_COMPARED:
            continue
        assert name in got, f"{name} is rendered but the server does not know it"
        assert config_equal(name, value, got[name]), f"{name}: rendered {value!r}, running {got[name]!r}"


def test_secrets_are_read_exactly_as_written(live: Live) -> None:
    got = live.admin.config_get("masterauth")
    assert got["masterauth"] == TRICKY
    if live.loaded.spec.auth.mode == "password":
        assert live.admin.config_get("requirepass")["requirepass"] == TRICKY


def as_map(reply: object) -> dict[str, Any]:
    """A RESP3 map or a RESP2 flat list of pairs, as a dict with str keys."""
    if isinstance(reply, dict):
        return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in reply.items()}
    assert isinstance(reply, list)
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in zip(reply[::2], reply[1::2], strict=True)}


def test_default_user(live: Live) -> None:
    default = as_map(live.admin.call("ACL", "GETUSER", "default"))
    if live.loaded.spec.auth.mode == "acl":
        assert "off" in default["flags"]
    else:
        assert "on" in default["flags"] and "nopass" not in default["flags"] and default["passwords"]


def test_acl_default_user_off_and_app_user_denied(live: Live) -> None:
    if live.loaded.spec.auth.mode != "acl":
        return  # password mode: see test_default_user
    assert "off" in as_map(live.admin.call("ACL", "GETUSER", "default"))["flags"]
    rules = {line.split()[1]: line for line in live.admin.call("ACL", "LIST")}
    assert sorted(rules) == ["app", "default", "opsctl"]
    for user in ("opsctl", "app"):  # the rules deny them too, should a rename ever be dropped
        assert all(f"-{c.lower()}" in rules[user] for c in DISABLED) or "-@dangerous" in rules[user], rules[user]
    with live.client("app", APP_PASSWORD) as app:
        assert app.set("app:1", "v") and app.get("app:1") == "v"
        for command in DISABLED:
            with pytest.raises(redis.ResponseError, match="unknown command"):
                app.execute_command(command, *(["*"] if command == "KEYS" else []))
        for command, args in ((RENAMED_CONFIG, ("GET", "*")), ("ACL", ("SETUSER", "app", "+@all")),
                              ("SET", ("other:1", "v"))):
            with pytest.raises(redis.exceptions.NoPermissionError):
                app.execute_command(command, *args)


FLAVORS = ("valkey", "redis")


@pytest.mark.parametrize("mode", ["password", "acl"])
@pytest.mark.parametrize("flavor", FLAVORS)
def test_sentinel_config_starts_and_answers(flavor: str, mode: str, request: pytest.FixtureRequest,
                                            tmp_path: Path) -> None:
    spec = make_spec("sentinel", flavor, auth=auth_section(mode),
                     hardening={"renamed_commands": {"CONFIG": RENAMED_CONFIG, "REPLICAOF": "OPS_REPLICAOF_L1VE"}})
    loaded = load(spec)
    sentinel = start(request, loaded, loaded.layout.sentinels[0], tmp_path)
    masters = sentinel.admin.raw("SENTINEL", "MASTERS")
    names = [str(as_map(m)["name"]) for m in masters]
    assert names == [loaded.spec.name], masters
    assert sentinel.anonymous("SENTINEL", "MASTERS").startswith("-NOAUTH")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_cluster_node_config_starts(flavor: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Cheap: a cluster node's rendered file is accepted and every directive of it is in effect."""
    loaded = load(make_spec("cluster", flavor, auth=auth_section("acl")))
    node = start(request, loaded, loaded.layout.nodes[0], tmp_path)
    got = node.admin.config_get("*")
    for name, value in node.sections:
        if is_config_directive(name) and name not in NOT_COMPARED:
            assert config_equal(name, value, got[name]), f"{name}: rendered {value!r}, running {got[name]!r}"
