"""The node handle's boundary (opsctl.net.connection): every client error converted into one vocabulary, and the
facts it reads (opsctl.observe.replies), parsed from golden replies. No server: see test_connection_live."""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

import hiredis
import pytest
import redis
import yaml

from opsctl.base.errors import (
    AuthRefused,
    NodeError,
    NodeRefused,
    NodeUnreachable,
    OpsctlError,
    PipeClosed,
    is_auth_failure,
)
from opsctl.net.connection import Connection, connection_to, said
from opsctl.net.connector import Connector
from opsctl.net.rawpipe import PIPE_ERRORS, link_error
from opsctl.observe.replies import CLUSTER_INFO, CLUSTER_NODES, ROLE, RespError, RoleInfo, config, info
from opsctl.spec.layout import Node
from opsctl.spec.load import load_spec, make_resolver
from tests.support import PASSWORD, PASSWORD_ENV, make_spec


def _handle() -> Connection:
    loaded = load_spec(yaml.safe_dump(make_spec("standalone", hosts=1)), "spec.yaml",
                       make_resolver({PASSWORD_ENV: PASSWORD}, lambda _: None))
    return connection_to(Connector(loaded), loaded.layout.nodes[0])


def test_one_error_family_at_the_boundary() -> None:
    assert issubclass(NodeError, OpsctlError)
    assert issubclass(NodeUnreachable, NodeError) and issubclass(NodeRefused, NodeError)
    assert issubclass(PipeClosed, NodeUnreachable) and issubclass(AuthRefused, NodeUnreachable)
    assert not issubclass(NodeRefused, NodeUnreachable)
    # the raw stack's old name still catches what the handle raises (call sites move in issue 34's WP6)
    assert all(issubclass(kind, PIPE_ERRORS) for kind in (NodeUnreachable, PipeClosed, AuthRefused))


@pytest.mark.parametrize(("words", "code"), [
    ("BUSYKEY Target key name already exists.", "BUSYKEY"),
    ("MOVED 3999 127.0.0.1:6381", "MOVED"),
    ("NOPERM User opsctl has no permissions to run the 'flushall' command", "NOPERM"),
    ("ERR unknown command 'CONFIG'", "ERR"),
    ("unknown subcommand", ""),
    ("", ""),
])
def test_a_refusal_carries_its_error_code(words: str, code: str) -> None:
    assert NodeRefused("n1 refused RESTORE", words).code == code


@pytest.mark.parametrize("error", [
    ConnectionRefusedError(111, "Connection refused"),
    TimeoutError("timed out"),
    hiredis.ProtocolError("Protocol error, got 'H' as reply type byte"),
])
def test_raw_stack_errors_become_node_unreachable_in_the_same_words(error: Exception) -> None:
    handle = _handle()
    with pytest.raises(NodeUnreachable) as raised, handle.pipe_errors():
        raise error
    assert handle.name in raised.value.summary and handle.endpoint in raised.value.summary
    assert raised.value.why == link_error(error)  # an observation keeps the words it kept before the handle


@pytest.mark.parametrize(("error", "kind", "code"), [
    (redis.AuthenticationError("WRONGPASS invalid username-password pair"), AuthRefused, ""),
    (redis.ConnectionError("Error 111 connecting to 127.0.0.1:7000. Connection refused."), NodeUnreachable, ""),
    (redis.TimeoutError("Timeout reading from socket"), NodeUnreachable, ""),
    (redis.ResponseError("NOPERM this user has no permissions"), NodeRefused, "NOPERM"),
    (redis.ResponseError("BUSYKEY Target key name already exists."), NodeRefused, "BUSYKEY"),
])
def test_redis_py_errors_become_the_same_vocabulary(error: Exception, kind: type[NodeError], code: str) -> None:
    handle = _handle()
    with pytest.raises(kind) as raised, handle.client_errors("RESTORE k"):
        raise error
    assert type(raised.value) is kind
    if isinstance(raised.value, NodeRefused):
        assert raised.value.code == code and raised.value.summary == f"{handle.name} refused RESTORE k"
    if kind is AuthRefused:
        assert is_auth_failure(link_error(raised.value))


def test_said_says_a_node_error_in_one_line() -> None:
    """net.connection.said: a refusal's reply words; else why the node did not answer, in the words a raw error
    said before the handle (a call site's detail keeps them)."""
    assert said(NodeRefused("n1 refused CONFIG SET", "ERR Invalid argument")) == "ERR Invalid argument"
    handle, error = _handle(), ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(NodeUnreachable) as raised, handle.pipe_errors():
        raise error
    assert said(raised.value) == link_error(error) == "ConnectionRefusedError: [Errno 111] Connection refused"
    assert said(PipeClosed("n1 closed the connection", "it restarted")) == "n1 closed the connection: it restarted"


def _answering(handle: Connection, replies: list[Any]) -> None:
    """handle's round trips answered with replies (bytes, as the raw stack reads them)."""
    handle.pipeline = lambda commands, chunk=0, timeout=None: replies  # type: ignore[method-assign]


def test_read_all_parses_in_order_and_an_error_reply_is_a_refusal_with_its_code() -> None:
    handle = _handle()
    _answering(handle, [b"role:master\r\nconnected_slaves:0\r\n", [b"master", 42, []]])
    got_info, role = handle.read_all(info("replication"), ROLE)
    assert got_info == {"role": "master", "connected_slaves": "0"} and role == RoleInfo("master", 42)
    _answering(handle, [RespError("ERR unknown command 'CLUSTER'")])
    with pytest.raises(NodeRefused) as raised:
        handle.read(CLUSTER_INFO)
    assert raised.value.code == "ERR" and "CLUSTER INFO" in raised.value.summary


def test_call_refuses_and_ping_says_no() -> None:
    handle = _handle()
    _answering(handle, [RespError("BUSYKEY Target key name already exists.")])
    with pytest.raises(NodeRefused) as raised:
        handle.call("RESTORE", b"k", 0, b"payload")
    assert raised.value.code == "BUSYKEY"
    assert not handle.ping()
    _answering(handle, [b"PONG"])
    assert handle.ping()


def test_a_transaction_returns_execs_replies_and_refuses_what_the_node_would_not_queue() -> None:
    handle = _handle()
    _answering(handle, [b"OK", b"QUEUED", b"QUEUED", [b"OK", 1]])
    assert handle.transaction([("SET", "k", "v"), ("INCR", "n")]) == [b"OK", 1]
    _answering(handle, [b"OK", RespError("ERR unknown command 'NOPE'"), RespError("EXECABORT Transaction "
                                                                                   "discarded")])
    with pytest.raises(NodeRefused, match="NOPE"):
        handle.transaction([("NOPE",)])
    _answering(handle, [b"OK", b"QUEUED", None])
    with pytest.raises(NodeRefused, match="EXEC"):
        handle.transaction([("SET", "k", "v")])


def _dialled(handle: Connection, monkeypatch: pytest.MonkeyPatch) -> list[socket.socket]:
    """handle's pipes dial one end of a new socket pair each; the node's ends, in order (nothing answers on them)."""
    far: list[socket.socket] = []

    def dial(node: Node, timeout: float = 30.0, auth: bool = True) -> socket.socket:
        ours, theirs = socket.socketpair()
        far.append(theirs)
        return ours
    monkeypatch.setattr(handle.connector, "socket", dial)
    return far


def test_a_held_pipe_converts_only_its_own_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """dedicated() and held(): the pipe's own failure is the handle's NodeUnreachable; another node's failure (a
    pipe opened before, used while this one is held: the restore's source beside its targets) or a file's error
    raised in the block keeps its own words and node."""
    mine = _handle()
    other = connection_to(Connector(mine.connector.loaded), replace(mine.node, name="elsewhere", port=1))
    _dialled(mine, monkeypatch), _dialled(other, monkeypatch)
    with other.dedicated() as theirs:
        theirs.settimeout(0.01)
        for held in (mine.dedicated, mine.held):
            with pytest.raises(NodeUnreachable) as raised, held():
                theirs.call("PING")  # the other node stalls
            assert "elsewhere" in raised.value.summary and mine.name not in raised.value.summary
            with pytest.raises(FileNotFoundError), held():
                open("/nonexistent/opsctl-test")  # noqa: SIM115 (a file's error, not the node's)
    with mine.dedicated() as pipe:
        pipe.settimeout(0.01)
        with pytest.raises(NodeUnreachable) as raised:
            pipe.call("PING")
    assert mine.name in raised.value.summary and raised.value.why == "TimeoutError: timed out"
    with pytest.raises(NodeUnreachable) as raised, mine.held() as pipe:
        pipe.settimeout(0.01)
        pipe.call("PING")
    assert mine.endpoint in raised.value.summary

    def refused(node: Node, timeout: float = 30.0, auth: bool = True) -> socket.socket:
        raise ConnectionRefusedError(111, "Connection refused")
    monkeypatch.setattr(mine.connector, "socket", refused)
    with pytest.raises(NodeUnreachable) as raised:
        mine.dedicated()
    assert mine.name in raised.value.summary and "refused" in raised.value.why


def test_close_twice_is_harmless_and_a_closed_handle_is_said_so() -> None:
    handle = _handle()
    handle.close()
    handle.close()
    with pytest.raises(OpsctlError, match="closed"):
        handle.pipes()


# --- the facts, parsed from golden replies (as texts() decodes them) ------------------------------------------------

ROLE_REPLIES = [
    (["master", 3129659, [["127.0.0.1", "7001", "3129242"], ["127.0.0.1", "7002", "3129543"]]],
     RoleInfo("master", 3129659, replicas=(("127.0.0.1", 7001, 3129242), ("127.0.0.1", 7002, 3129543)))),
    (["slave", "127.0.0.1", 7000, "connected", 3167038], RoleInfo("replica", 3167038, ("127.0.0.1", 7000),
                                                                   "connected")),
    (["sentinel", ["mymaster", "other"]], RoleInfo("sentinel", monitors=("mymaster", "other"))),
]


@pytest.mark.parametrize(("reply", "role"), ROLE_REPLIES)
def test_role_fact(reply: Any, role: RoleInfo) -> None:
    assert ROLE.command == ("ROLE",) and ROLE.parse(reply) == role


def test_info_facts_by_section() -> None:
    assert info().command == ("INFO",) and info("replication").command == ("INFO", "replication")
    text = "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_link_status:up\r\n\r\n# Keyspace\r\n" \
           "db0:keys=3,expires=0,avg_ttl=0\r\n"
    assert info("replication").parse(text) == {"role": "slave", "master_host": "127.0.0.1",
                                               "master_link_status": "up", "db0": "keys=3,expires=0,avg_ttl=0"}
    assert CLUSTER_INFO.command == ("CLUSTER", "INFO")
    assert CLUSTER_INFO.parse("cluster_state:ok\r\ncluster_slots_assigned:16384\r\n") == {
        "cluster_state": "ok", "cluster_slots_assigned": "16384"}


def test_cluster_nodes_fact() -> None:
    text = ("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n"
            "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:7001@17001 slave "
            "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 1 connected\n")
    me, replica = CLUSTER_NODES.parse(text)
    assert CLUSTER_NODES.command == ("CLUSTER", "NODES")
    assert me.is_myself and me.slot_count == 5461 and (me.address, me.port) == ("127.0.0.1", 7000)
    assert replica.master_id == me.id


def test_config_fact() -> None:
    assert config().command == ("CONFIG", "GET", "*")
    assert config("max*").parse(["maxmemory", "67108864", "maxclients", "10000"]) == {
        "maxmemory": "67108864", "maxclients": "10000"}


@pytest.mark.parametrize(("fact", "reply"), [(ROLE, "master"), (CLUSTER_NODES, ["x"]), (config(), "x"),
                                             (info(), 5)])
def test_a_reply_of_the_wrong_shape_is_a_type_error(fact: Any, reply: Any) -> None:
    """The observer treats ValueError/IndexError/TypeError as an unexpected reply."""
    with pytest.raises(TypeError):
        fact.parse(reply)
