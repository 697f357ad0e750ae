"""Admin connections to nodes: authenticated, with the spec's renamed commands, short timeouts.

opsctl.net.connector.Connector makes every connection (route, auth, TLS) and wraps it in an Admin; command
renames live here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opsctl.base.errors import OpsctlError
from opsctl.spec.layout import Node, endpoint
from opsctl.spec.load import LoadedSpec

if TYPE_CHECKING:
    import redis

    from opsctl.observe.replies import Command


DEFAULT_TIMEOUT = 5.0


class Admin:
    """One node's admin connection. `call` sends a command under its renamed name if the spec renames it.
    redis-py, not the raw stack (opsctl.net.rawpipe): its replies come parsed, one command at a time."""

    def __init__(self, loaded: LoadedSpec, node: Node, client: redis.Redis) -> None:
        self.loaded = loaded
        self.node = node
        self.address = node.address
        self.port = node.port
        self.name = node.name
        self.sentinel = node.is_sentinel
        self.client = client

    @property
    def endpoint(self) -> str:
        return endpoint(self.address, self.port)

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
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command(self.command(name), *args)
            return conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def info(self, section: str = "all") -> str:
        """INFO as text; the pure parser is opsctl.observe.parse_info."""
        return str(self.raw("INFO", section))

    def ping(self) -> bool:
        import redis

        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def raw_pipeline(admin: Admin, commands: Sequence[Command], chunk: int = 0) -> list[Any]:
    """Send commands (renamed as the spec says) on one of admin's connections (redis-py's pipelining, for a caller
    that holds an Admin already; the raw stack's is opsctl.net.rawpipe.NodePipes); replies unparsed, in order, errors as
    exception objects. chunk > 0 packs and sends that many at a time, so the server starts on the first
    commands while the client still packs the rest."""
    step = chunk or max(1, len(commands))

    def send(conn: Any) -> None:
        for at in range(0, len(commands), step):
            part = commands[at:at + step]
            conn.send_packed_command(conn.pack_commands([(admin.command(c[0]), *c[1:]) for c in part]))

    return round_trip(admin, send, len(commands))


def round_trip(admin: Admin, send: Callable[[Any], None], count: int) -> list[Any]:
    """What send writes on one of admin's pooled connections, then count replies, unparsed, errors as exception
    objects. A connection that broke mid-way is disconnected, not returned to the pool half read."""
    import redis

    pool = admin.client.connection_pool
    conn = pool.get_connection()
    try:
        send(conn)
        replies: list[Any] = []
        for _ in range(count):
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


def with_fallback(pool: redis.ConnectionPool, previous: str) -> None:
    """During a password rotation (auth.previous_password) a node may still run with the previous password:
    each new connection tries the spec's password, then the previous one."""
    import redis

    base = pool.connection_class
    if getattr(base, "opsctl_fallback", False):
        return

    class FallbackConnection(base):  # type: ignore[valid-type,misc]
        opsctl_fallback = True

        def on_connect_check_health(self, check_health: bool = True) -> None:
            try:
                super().on_connect_check_health(check_health)
            except redis.AuthenticationError:
                current = getattr(self, "password", None)
                setattr(self, "password", previous)  # noqa: B010 (a dynamic base class: mypy cannot see it)
                try:
                    super().on_connect_check_health(check_health)
                finally:
                    setattr(self, "password", current)  # noqa: B010

    pool.connection_class = FallbackConnection


def unreachable(admin: Admin, exc: Exception) -> OpsctlError:
    return OpsctlError(f"cannot reach {admin.name} at {admin.endpoint}", str(exc),
                       "is it running? `opsctl status -f SPEC` shows every node")
