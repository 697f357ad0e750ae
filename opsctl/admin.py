"""Admin connections to nodes: authenticated, with the spec's renamed commands, short timeouts.

Everything that talks to a Redis node goes through here, so auth and command renames live in one place.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from opsctl.endpoints import endpoint
from opsctl.errors import OpsctlError
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

DEFAULT_TIMEOUT = 5.0
Route = Callable[[Node], tuple[str, int]]
_ROUTES: dict[int, Route] = {}
_ROUTES_LOCK = threading.Lock()


def route_admin(loaded: LoadedSpec, route: Route | None) -> None:
    """Send admin traffic for loaded's nodes to route(node) -> (address, port), e.g. a local SSH tunnel,
    instead of node.address:port (None removes the route). Lives as long as this LoadedSpec object."""
    key = id(loaded)
    with _ROUTES_LOCK:
        if route is None:
            _ROUTES.pop(key, None)
            return
        if key not in _ROUTES:
            weakref.finalize(loaded, _ROUTES.pop, key, None)
        _ROUTES[key] = route


def _route_for(loaded: LoadedSpec) -> Route | None:
    with _ROUTES_LOCK:
        return _ROUTES.get(id(loaded))


class Admin:
    """One node's admin connection. `call` sends a command under its renamed name if the spec renames it."""

    def __init__(self, loaded: LoadedSpec, address: str, port: int, name: str = "",
                 timeout: float = DEFAULT_TIMEOUT, sentinel: bool = False, decode: bool = True,
                 connect_to: tuple[str, int] | None = None) -> None:
        """connect_to: where the TCP connection really goes (a tunnel); address:port stay the node's."""
        self.loaded = loaded
        self.address = address
        self.port = port
        self.name = name or endpoint(address, port)
        self.sentinel = sentinel
        spec = loaded.spec
        acl = spec.auth.mode == "acl" and not sentinel
        self.client = redis.Redis(
            host=connect_to[0] if connect_to else address, port=connect_to[1] if connect_to else port,
            username=spec.auth.admin_user if acl else None,
            password=loaded.credentials.password.reveal(),
            socket_timeout=timeout, socket_connect_timeout=timeout,
            decode_responses=decode,
            retry=Retry(NoBackoff(), 0),  # a refused connection is an answer: no 3 s of silent retries
        )
        self._renames = {k.upper(): v for k, v in spec.hardening.renamed_commands.items()}
        previous = loaded.credentials.previous
        if previous is not None and previous.reveal():
            with_fallback(self.client.connection_pool, previous.reveal())

    @classmethod
    def for_node(cls, loaded: LoadedSpec, node: Node, timeout: float = DEFAULT_TIMEOUT, decode: bool = True) -> Admin:
        """decode=False keeps replies as bytes (key names are binary-safe that way). Goes through the route
        registered with route_admin() for this spec, if any."""
        route = _route_for(loaded)
        return cls(loaded, node.address, node.port, node.name, timeout, sentinel=node.is_sentinel, decode=decode,
                   connect_to=route(node) if route else None)

    @property
    def endpoint(self) -> str:
        return endpoint(self.address, self.port)

    def command(self, name: str) -> str:
        return self._renames.get(name.upper(), name.upper())

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


def with_fallback(pool: redis.ConnectionPool, previous: str) -> None:
    """During a password rotation (auth.previous_password) a node may still run with the previous password:
    each new connection tries the spec's password, then the previous one."""
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
