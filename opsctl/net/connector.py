"""The one place that connects to nodes: address or SSH route, auth, TLS. Everything else gets a Connector.

A Connector is made once per command (opsctl.runtime.opening) and passed down; it hands out redis-py clients (a
handle's pub/sub, probes) and authenticated raw sockets. With TLS each connection verifies the certificate against
the node's address, through an SSH tunnel too. The node handle over them is opsctl.net.connection.connection_to
(not a method here: the raw stack that handle holds imports this module)."""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opsctl.base.errors import AuthRefused, OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.secrets import Secret
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

if TYPE_CHECKING:
    import ssl

    import redis
    from redis.connection import Connection

Route = Callable[[Node], tuple[str, int]]

DEFAULT_TIMEOUT = 5.0


@frozen
class ClientTLS(Frozen):
    """What opsctl needs to speak TLS to the nodes: the CA bundle it trusts, and its client certificate
    (servers with tls-auth-clients yes/optional ask for one)."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")

    def context(self) -> ssl.SSLContext:
        import ssl  # only with TLS: a plaintext topology's commands never load it

        tls_versions = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
        versions = sorted(tls_versions[p] for p in self.protocols if p in tls_versions)
        if versions:
            context.minimum_version, context.maximum_version = versions[0], versions[-1]
        try:
            context.load_verify_locations(cafile=self.ca_file)
            if self.cert_file and self.key_file:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise OpsctlError("cannot load opsctl's TLS files", f"{self.ca_file}: {exc}",
                              "check tls.ca / tls.cert / tls.key in the spec (or run `opsctl apply`, "
                              "which generates them with tls.generate: true)") from None
        return context


# redis-py is imported by the first client made, not with this module: commands that only observe nodes (plan,
# status) go through raw sockets (Connector.socket) and never load it, a large share of a short command's start.


@functools.cache
def _driver() -> dict[str, Any]:
    """The driver_info every redis-py client gets, so redis-py >= 7 does not resolve its version per connection."""
    import redis

    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # older redis-py: a version resolved once, by default
        return {}
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


@functools.cache
def _tls_connection() -> type[Connection]:
    from redis.connection import Connection

    class TLSConnection(Connection):
        """redis-py connection wrapped in a shared SSLContext, verified against server_hostname (the node's
        address) rather than the host it dials (a tunnel's 127.0.0.1)."""

        def __init__(self, *, tls_context: ssl.SSLContext, server_hostname: str, **kwargs: Any) -> None:
            self.tls_context = tls_context
            self.server_hostname = server_hostname
            super().__init__(**kwargs)  # type: ignore[no-untyped-call]

        def _connect(self) -> socket.socket:
            sock = super()._connect()  # type: ignore[no-untyped-call]
            try:
                return self.tls_context.wrap_socket(sock, server_hostname=self.server_hostname)
            except BaseException:
                sock.close()
                raise

    return TLSConnection


class Connector:
    """Connections to the nodes of one spec. route: where TCP really goes for a node (an SSH tunnel);
    tls: None for plaintext. run: the connector of the run this one is a view of (over), itself by default: the
    locks a run holds (net.topolock) are its run's."""

    def __init__(self, loaded: LoadedSpec, route: Route | None = None, tls: ClientTLS | None = None,
                 run: Connector | None = None, login: tuple[str, Secret] | None = None) -> None:
        self.loaded = loaded
        self.login = login  # another ACL user than the admin (a standby's follower), its password
        self.run: Connector = run if run is not None else self
        self.route = route
        self.tls = tls
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    def over(self, loaded: LoadedSpec) -> Connector:
        """A connector for another view of the same spec (a placed layout, a layout with a member back for one
        step): the same route and TLS, a new object; this one is left as it is."""
        return Connector(loaded, self.route, self.tls, self.run, self.login)

    def as_user(self, name: str, password: Secret) -> Connector:
        """A connector to the same nodes (route, TLS, the run's locks) logged in as another ACL user: a standby's
        follower user, the one that writes while the clients' are fenced."""
        return Connector(self.loaded, self.route, self.tls, self.run, (name, password))

    def dial(self, node: Node) -> tuple[str, int]:
        """The TCP endpoint for node: its own, or its route's."""
        return self.route(node) if self.route else (node.address, node.port)

    def tls_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        with self._lock:
            if self._context is None:
                self._context = self.tls.context()
            return self._context

    def client(self, node: Node, timeout: float = DEFAULT_TIMEOUT, decode: bool = True, auth: bool = True,
               tls: bool = True) -> redis.Redis:
        """A redis-py client for node, no client-side retries (a refused connection is an answer).
        auth=False: anonymous (probes); tls=False: plaintext even when TLS is on (audit of a plaintext port)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        spec = self.loaded.spec
        host, port = self.dial(node)
        acl = spec.auth.mode == "acl" and not node.is_sentinel
        user, password = self.login or (spec.auth.admin_user if acl else None, self.loaded.credentials.password)
        kwargs: dict[str, Any] = {
            "host": host, "port": port, "socket_timeout": timeout, "socket_connect_timeout": timeout,
            "decode_responses": decode, "retry": Retry(NoBackoff(), 0),
            "username": user if auth else None, "password": password.reveal() if auth else None, **_driver(),
        }
        context = self.tls_context() if tls else None
        if context is not None:
            kwargs.update(connection_class=_tls_connection(), tls_context=context, server_hostname=node.address)
        pool = redis.ConnectionPool(**kwargs)
        previous = self.loaded.credentials.previous
        if auth and self.login is None and previous is not None and previous.reveal():
            with_fallback(pool, previous.reveal())
        client = redis.Redis(connection_pool=pool)
        client.auto_close_connection_pool = True
        return client

    def _passwords(self) -> list[str]:
        """The spec's password, then the previous one while a rotation keeps it (auth.previous_password)."""
        if self.login is not None:
            return [self.login[1].reveal()]
        previous = self.loaded.credentials.previous
        return [self.loaded.credentials.password.reveal(), *([previous.reveal()] if previous and previous.reveal()
                                                              else [])]

    def socket(self, node: Node, timeout: float = 30.0, auth: bool = True) -> socket.socket:
        """A connected, authenticated socket to node (TLS-wrapped when TLS is on) for raw RESP.
        auth=False: anonymous (the audit's probe of what a client without a password may do)."""
        sock = socket.create_connection(self.dial(node), timeout=timeout)
        try:
            context = self.tls_context()
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=node.address)
            reply = b"" if auth else b"+"  # anonymous: nothing to refuse
            for password in self._passwords() if auth else []:
                sock.sendall(_auth_command(self.loaded, node, password, self.login and self.login[0]))
                reply = _read_line(sock)
                if reply.startswith(b"+"):
                    break
        except BaseException:
            sock.close()
            raise
        if not reply.startswith(b"+"):
            sock.close()
            raise AuthRefused(f"{node.name} refused opsctl's AUTH", reply.decode("utf-8", "replace")[:200],
                              "check auth.password in the spec")
        return sock


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


def _auth_command(loaded: LoadedSpec, node: Node, password: str, user: str | None = None) -> bytes:
    spec = loaded.spec
    words = ["AUTH"]
    if user is not None:
        words.append(user)
    elif spec.auth.mode == "acl" and not node.is_sentinel:
        words.append(spec.auth.admin_user)
    words.append(password)
    encoded = [w.encode() for w in words]
    return b"*%d\r\n" % len(encoded) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in encoded)


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the node closed the connection during AUTH")
        line += chunk
    return line[:-2]


def port_accepts(address: str, port: int, timeout: float = 0.2) -> bool:
    """Whether address:port accepts TCP connections (a started server is listening)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def unix_socket(path: str, timeout: float) -> socket.socket:
    """A raw connection to a private server on a unix socket (backup/restore scratch servers: no auth, no TLS)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock

