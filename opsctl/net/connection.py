"""The node handle: one node's connections, fabric's Connection for a Redis node.

Connection holds the raw pipes (opsctl.net.rawpipe: hiredis, kept between round trips) opened on first use, and a
redis-py client only for what needs it (pub/sub); commands go out under the spec's renames;
every client error is converted here into opsctl.base.errors' NodeUnreachable or NodeRefused. Connections holds a
Connection per node for a run (observing, a session), made on first use and closed once.

redis-py is imported only by what needs its client: plan and status read over the raw pipes alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import hiredis

from opsctl.base.errors import AuthRefused, NodeRefused, NodeUnreachable, OpsctlError, error_text
from opsctl.net.connector import DEFAULT_TIMEOUT, Connector, unix_socket
from opsctl.net.fanout import fan_out
from opsctl.net.rawpipe import NodePipes, RawPipe
from opsctl.net.resp import encode_keyed, text
from opsctl.observe.replies import Arg, Command, Fact, Reply, RespError, TextReply, config
from opsctl.spec.layout import Node

if TYPE_CHECKING:
    import redis
    import redis.client

T = TypeVar("T")

UNREACHABLE_HINT = "is it running? `opsctl status -f SPEC` shows every node"
SUBSCRIBED_WAIT = 0.5  # how long subscribe() waits for the node's confirmation


class Subscription:
    """Messages published on the channels a Connection subscribed to (redis-py's pubsub, errors converted)."""

    def __init__(self, connection: Connection, pubsub: redis.client.PubSub) -> None:
        self._connection = connection
        self._pubsub = pubsub

    def get(self, timeout: float = 1.0) -> tuple[str, str] | None:
        """The next message as (channel, data), or None when none came within timeout."""
        with self._connection.client_errors("a subscription"):
            message = self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        if message is None:
            return None
        return str(message["channel"]), str(message["data"])

    def close(self) -> None:
        self._pubsub.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Connection:
    """One node. The raw pipes (hiredis, pooled) open on first use, a redis-py client only for what needs it
    (pub/sub); commands are renamed as the spec says; every client error is converted here into NodeUnreachable or
    NodeRefused; thread-safe as NodePipes is (a pipe per round trip); close() closes both, once.
    fail_fast: no redis-py retries on that client (observers poll anyway)."""

    def __init__(self, connector: Connector, node: Node, timeout: float = DEFAULT_TIMEOUT,
                 fail_fast: bool = False) -> None:
        self.connector, self.node, self.timeout, self.fail_fast = connector, node, timeout, fail_fast
        self.name = node.name
        self.endpoint = node.endpoint
        self._pipes: NodePipes | None = None
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()
        self._closed = False

    # --- the boundary: every client error becomes NodeUnreachable or NodeRefused -----------------------------------

    def unreachable(self, exc: BaseException) -> NodeUnreachable:
        """exc (a socket, TLS, protocol or redis-py connection error) as NodeUnreachable naming the node."""
        return NodeUnreachable(f"cannot reach {self.name} at {self.endpoint}", error_text(exc), UNREACHABLE_HINT)

    def refused(self, words: str, message: str) -> NodeRefused:
        return NodeRefused(f"{self.name} refused {words}", message)

    @contextmanager
    def pipe_errors(self) -> Iterator[None]:
        """The raw stack's errors converted (no redis-py here: the raw path never imports it)."""
        try:
            yield
        except (OSError, hiredis.ProtocolError) as exc:
            raise self.unreachable(exc) from exc

    @contextmanager
    def client_errors(self, words: str) -> Iterator[None]:
        """redis-py's errors converted: a refused AUTH, no answer, an error reply."""
        import redis

        try:
            yield
        except redis.AuthenticationError as exc:
            raise AuthRefused(f"{self.name} refused opsctl's AUTH", str(exc), "check auth.password in the spec") \
                from exc
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise self.unreachable(exc) from exc
        except redis.ResponseError as exc:
            raise self.refused(words, str(exc)) from exc

    # --- the raw pipes ---------------------------------------------------------------------------------------------

    def pipes(self) -> NodePipes:
        with self._lock:
            if self._closed:
                raise OpsctlError(f"the connection to {self.name} is closed")
            if self._pipes is None:
                self._pipes = NodePipes(self.connector, self.node, self.timeout, self.unreachable)
            return self._pipes

    def command(self, name: str) -> str:
        """A command's name as this node knows it (the spec's renames)."""
        return self.pipes().command(name)

    def pipeline(self, commands: Sequence[Command], chunk: int = 0, timeout: float | None = None) -> list[Reply]:
        """One round trip, replies in order; error replies stay RespError values (the others' replies stand)."""
        with self.pipe_errors():
            return self.pipes().pipeline(commands, chunk, timeout)

    def packed(self, commands: Sequence[Command]) -> bytes:
        """Commands under the node's renames, packed in one buffer (for a stream over held())."""
        return self.pipes().packed(commands)

    def keyed(self, command: str, subcommand: str, keys: Sequence[bytes]) -> list[Reply]:
        """`command subcommand key` for every key (`MEMORY USAGE k1`, ...) in one round trip, packed in one buffer
        (opsctl.net.resp.encode_keyed), for 100k keys and more; error replies stay RespError values."""
        if not keys:
            return []
        packed = encode_keyed(self.command(command).encode(), keys, subcommand.encode())
        with self.pipe_errors():
            return self.pipes().round_trip(lambda raw: raw.send(packed), len(keys))

    @contextmanager
    def held(self) -> Iterator[RawPipe]:
        """One of the kept pipes, the caller's alone until the block ends, so writes and reads may interleave (a
        stream that keeps the next commands queued while it reads the replies before); back in the pool whole,
        closed if the block failed. The pipe's own errors are converted as the handle's are; another error raised
        in the block (another node's) passes as it is."""
        with self.pipes().held() as pipe:
            yield pipe

    def texts(self, commands: Sequence[Command]) -> list[TextReply]:
        """pipeline, with the replies decoded to text (what observing reads)."""
        return [text(reply) for reply in self.pipeline(commands)]

    def call(self, command: str, *args: Arg) -> Reply:
        """One command; an error reply raises NodeRefused (with its code: BUSYKEY, MOVED, ...)."""
        reply = self.pipeline([(command, *args)])[0]
        if isinstance(reply, RespError):
            raise self.refused(" ".join(str(a) for a in (command, *args[:1])), reply.message)
        return reply

    def read(self, fact: Fact[T]) -> T:
        """A fact (opsctl.observe.replies), sent and parsed; an error reply raises NodeRefused."""
        return self.read_all(fact)[0]  # type: ignore[no-any-return]

    def read_all(self, *facts: Fact[Any]) -> tuple[Any, ...]:
        """Facts in one round trip, parsed in order; the first error reply raises NodeRefused."""
        replies = self.texts([fact.command for fact in facts])
        for fact, reply in zip(facts, replies, strict=True):
            if isinstance(reply, RespError):
                raise self.refused(" ".join(str(w) for w in fact.command[:2]), reply.message)
        return tuple(fact.parse(reply) for fact, reply in zip(facts, replies, strict=True))

    def config_get(self, pattern: str = "*") -> dict[str, str]:
        return self.read(config(pattern))

    def config_set(self, directive: str, value: str) -> None:
        self.call("CONFIG", "SET", directive, value)

    def ping(self) -> bool:
        """Whether the node answers PING (a refused or unreachable node does not)."""
        try:
            return self.call("PING") in (b"PONG", "PONG")
        except (NodeUnreachable, NodeRefused):
            return False

    def transaction(self, commands: Sequence[Command]) -> list[Reply]:
        """commands inside MULTI/EXEC, in one round trip: EXEC's replies (an error reply of one command stays a
        RespError value). A command the node refused to queue raises NodeRefused, and nothing runs."""
        replies = self.pipeline([("MULTI",), *commands, ("EXEC",)])
        for cmd, reply in zip([("MULTI",), *commands], replies, strict=False):
            if isinstance(reply, RespError):
                raise self.refused(" ".join(str(w) for w in cmd[:2]), reply.message)
        done = replies[-1]
        if isinstance(done, RespError):
            raise self.refused("EXEC", done.message)
        if not isinstance(done, list):
            raise self.refused("EXEC", "the transaction was aborted")
        return done

    def dedicated(self, timeout: float = 30.0) -> RawPipe:
        """A raw pipe of the caller's alone, held whole (SELECT state, a lock marker, a long scan, a copy's
        connections across pages): `with handle.dedicated() as pipe`, or closed by its owner. Only the pipe's own
        errors are converted as the handle's are (opsctl.net.rawpipe.RawPipe's failed): another node's error
        raised while it is held keeps its node. The handle itself holds nothing for it."""
        return RawPipe(self.connector, self.node, timeout, self.unreachable)

    # --- redis-py, only for what needs it (pub/sub) ----------------------------------------------------------------

    def _redis(self) -> redis.Redis:
        """The node's redis-py client (the connector's route, AUTH and TLS), made on first use and closed with this
        handle."""
        with self._lock:
            if self._closed:
                raise OpsctlError(f"the connection to {self.name} is closed")
            if self._client is None:
                self._client = self.connector.client(self.node, self.timeout)
                if self.fail_fast:
                    _no_retries(self._client)
            return self._client

    def subscribe(self, *channels: str, timeout: float = SUBSCRIBED_WAIT) -> Subscription:
        """Messages published on channels (Sentinel's hellos, +new-epoch), over a connection of the redis-py client's.
        Returns once the node confirmed every channel: a message published after that reaches the subscription
        (NodeUnreachable when no confirmation came within timeout)."""
        words = f"SUBSCRIBE {' '.join(channels)}"
        pubsub = self._redis().pubsub()
        try:
            with self.client_errors(words):
                pubsub.subscribe(*channels)
                _confirmed(pubsub, len(channels), timeout)
        except BaseException:
            pubsub.close()
            raise
        return Subscription(self, pubsub)

    def close(self) -> None:
        """Close the pipes and the redis-py client; a second close does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pipes, client = self._pipes, self._client
        if pipes is not None:
            pipes.close()
        if client is not None:
            client.close()

    @classmethod
    def on_unix(cls, path: str, label: str, timeout: float) -> Connection:
        """The handle of a private server on a unix socket (a scratch server's: no AUTH, no TLS, no renames, no
        redis-py client); label names it in errors."""
        return _OnUnixSocket(path, label, timeout)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _OnUnixSocket(Connection):
    """A private server on a unix socket (a scratch server: no AUTH, no TLS, no renames): one pipe, held per round
    trip under the lock, opened again after it broke; no redis-py client."""

    def __init__(self, path: str, label: str, timeout: float) -> None:
        self.path, self.name, self.endpoint, self.timeout, self.fail_fast = path, label, path, timeout, True
        self._lock = threading.Lock()
        self._closed = False
        self._pipe: RawPipe | None = None
        self._client = None

    def _open(self, timeout: float) -> RawPipe:
        with self.pipe_errors():
            sock = unix_socket(self.path, timeout)
        return RawPipe.on_socket(sock, self.name, self.unreachable)

    def command(self, name: str) -> str:
        return name

    def pipeline(self, commands: Sequence[Command], chunk: int = 0, timeout: float | None = None) -> list[Reply]:
        with self._lock, self.pipe_errors():
            if self._closed:
                raise OpsctlError(f"the connection to {self.name} is closed")
            pipe, self._pipe = self._pipe or self._open(self.timeout), None
            try:
                pipe.settimeout(timeout or self.timeout)
                replies = pipe.call_all(commands)
            except BaseException:
                pipe.close()
                raise
            self._pipe = pipe
            return replies

    def dedicated(self, timeout: float = 30.0) -> RawPipe:
        return self._open(timeout)

    def pipes(self) -> NodePipes:
        raise OpsctlError(f"{self.name} has no pooled pipes (a unix socket's handle holds one pipe)")

    def _redis(self) -> redis.Redis:
        raise OpsctlError(f"{self.name} has no redis-py client (a unix socket's handle speaks over raw pipes only)")

    def close(self) -> None:
        with self._lock:
            self._closed, pipe, self._pipe = True, self._pipe, None
        if pipe is not None:
            pipe.close()


def _confirmed(pubsub: redis.client.PubSub, count: int, timeout: float) -> None:
    """Wait for count subscribe confirmations (they come before any message on their channels)."""
    import redis

    deadline = time.monotonic() + timeout
    while count > 0:
        left = deadline - time.monotonic()
        if left <= 0:
            raise redis.TimeoutError(f"no confirmation of the subscription within {timeout:g} s")
        message = pubsub.get_message(timeout=min(left, 0.01))
        if message is not None and message["type"] == "subscribe":
            count -= 1


def _no_retries(client: redis.Redis) -> None:
    """One connect attempt per command, no client-side retries: redis-py's retries with backoff would stall every
    look at a down node."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client.set_retry(Retry(NoBackoff(), 0))


def said(exc: BaseException) -> str:
    """What went wrong, in one line and the node's words: a refusal's error reply (INPROG ..., NOREPLICAS ...), why
    there was no answer (the cause's type and text), else the error's own text. For messages that name the node and
    the command themselves."""
    if isinstance(exc, NodeRefused):
        return exc.detail
    return exc.why if isinstance(exc, NodeUnreachable) else str(exc)




def connection_to(connector: Connector, node: Node, timeout: float = DEFAULT_TIMEOUT,
                  fail_fast: bool = False) -> Connection:
    """The node handle for node, over connector's route, AUTH and TLS; nothing is opened until first use."""
    return Connection(connector, node, timeout, fail_fast)


class Connections:
    """The nodes of a run: a Connection per node, made on first use, closed once."""

    def __init__(self, connector: Connector, nodes: Iterable[Node], timeout: float = DEFAULT_TIMEOUT,
                 fail_fast: bool = True) -> None:
        self.connector, self.timeout, self.fail_fast = connector, timeout, fail_fast
        self._nodes = {n.name: n for n in nodes}
        self._open: dict[str, Connection] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Connection:
        with self._lock:
            handle = self._open.get(name)
            if handle is None:
                handle = self._open[name] = connection_to(self.connector, self._nodes[name], self.timeout,
                                                          self.fail_fast)
            return handle

    def each(self, nodes: Iterable[Node], do: Callable[[Connection], T]) -> list[T]:
        """do(handle) for each node, in parallel (opsctl.net.fanout), results in order."""
        return fan_out(do, [self[n.name] for n in nodes])

    def close(self) -> None:
        with self._lock:
            handles, self._open = list(self._open.values()), {}
        for handle in handles:
            handle.close()
