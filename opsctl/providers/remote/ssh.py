"""SSH to hosts with paramiko: connect (known hosts checked, optional bastion), run, read files, tunnels.

An unknown host key is refused unless trust-on-first-use is asked for. `Tunnel` forwards a local port to a node as
the host sees it. A login other than root runs commands and the SFTP server through `sudo -n`, as Ansible's become
does (never a prompt: it would hang the channel)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import shlex
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

try:
    import paramiko
except ImportError as exc:  # provider: ansible without its extra: say which to install, not a traceback
    from opsctl.providers.binaries import ansible_extra_error, missing_ansible_libraries

    raise ansible_extra_error(missing_ansible_libraries()) from exc

from opsctl.base.errors import OpsctlError
from opsctl.providers.remote.inventory import parse_bastion
from opsctl.spec.model import Host, Spec

# paramiko logs what it then raises (a refused tunnel channel, a dropped connection) at ERROR; with no handler
# Python prints those lines bare on the operator's stderr. opsctl reports the errors itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
CONNECT_TIMEOUT = 10.0
# Where distributions put OpenSSH's SFTP server (Debian/Ubuntu, RHEL/Fedora/SUSE, Arch, Alpine/BSD).
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server",
                "/usr/libexec/sftp-server")


@dataclass(frozen=True)
class SshTarget:
    """Where and how to log in. bastion: the jump host, reached first."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key: str | None = None
    bastion: SshTarget | None = None

    @property
    def become(self) -> bool:
        """Privileged work on this host goes through sudo: the login is not root (the deploy folders are root's
        and the service user's, /proc of the servers is theirs)."""
        return self.user != "root"

    def describe(self) -> str:
        via = f" via {self.bastion.describe()}" if self.bastion else ""
        return f"{self.name} ({self.user}@{self.address}:{self.port}){via}"


@dataclass(frozen=True)
class CommandResult:
    status: int
    stdout: str
    stderr: str


# --- pure partners -----------------------------------------------------------------------------------------


def target_for(spec: Spec, host: Host) -> SshTarget:
    """The SSH target of a spec host. bastion names another host of the spec or is `[user@]address[:port]`."""
    user = host.ssh_user or "root"
    bastion = None
    if host.bastion:
        named = next((h for h in spec.hosts if h.name == host.bastion), None)
        if named is not None:
            bastion = target_for(spec, named)
        else:
            login, address, port = parse_bastion(host.bastion, user)
            bastion = SshTarget(f"bastion {address}", address, port, login, host.ssh_key)
    return SshTarget(host.name, host.address, host.ssh_port, user, host.ssh_key, bastion)


def become_command(command: str) -> str:
    """command as root through `sudo -n` (fails at once where sudo wants a password, rather than hanging)."""
    return f"sudo -n -- sh -c {shlex.quote(command)}"


def sftp_server_command() -> str:
    """The host's SFTP server as root: the first of SFTP_SERVERS there, else a message on stderr and status 127."""
    probes = " ".join(shlex.quote(p) for p in SFTP_SERVERS)
    return become_command(f'for p in {probes}; do if [ -x "$p" ]; then exec "$p"; fi; done; '
                          f'echo "no sftp-server in {" ".join(SFTP_SERVERS)}" >&2; exit 127')


def become_error(target: SshTarget, detail: str) -> OpsctlError:
    return OpsctlError(f"cannot become root on host {target.describe()}", detail or "sudo -n failed",
                       f"opsctl runs `sudo -n` where ssh_user is not root, as Ansible's become does: give "
                       f"{target.user} passwordless sudo (a line `{target.user} ALL=(root) NOPASSWD: ALL` in "
                       "/etc/sudoers.d/), or log in as root")


def known_hosts_path(explicit: str | None = None) -> str:
    """The known_hosts file: explicit, else $OPSCTL_SSH_KNOWN_HOSTS, else ~/.ssh/known_hosts."""
    chosen = explicit or os.environ.get("OPSCTL_SSH_KNOWN_HOSTS") or DEFAULT_KNOWN_HOSTS
    return os.path.expanduser(chosen)


Sftp: TypeAlias = paramiko.SFTPClient  # for modules that take a session without importing paramiko themselves

GONE = (OSError, EOFError, paramiko.SSHException)
"""What paramiko or a socket raises when a host cannot be reached or the SSH connection drops: paramiko raises a
bare EOFError for a request on a connection that has closed."""


class HostUnreachable(OpsctlError):
    """A host that did not answer (refused, timed out, no route, the connection dropped): not a refused login, a
    changed host key or a file that cannot be read there. Offline commands fall back on it (runtime.opening)."""


def ssh_error(target: SshTarget, exc: BaseException, doing: str = "connect to") -> OpsctlError:
    hints = {
        paramiko.BadHostKeyException: "the host key changed: verify the host, then update known_hosts",
        paramiko.AuthenticationException: "check ssh_user and ssh_key for this host (is the key authorized?)",
        paramiko.SSHException: "add the host key to known_hosts (ssh-keyscan, verified) or set "
                               "OPSCTL_SSH_KNOWN_HOSTS to the right file",
    }
    hint = next((h for cls, h in hints.items() if isinstance(exc, cls)),
                "is the host up and sshd listening on ssh_port? check address, bastion and firewalls")
    detail = "the SSH connection closed" if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}"
    kind = HostUnreachable if isinstance(exc, (OSError, EOFError)) else OpsctlError
    return kind(f"cannot {doing} host {target.describe()}", detail, hint)


# --- I/O -----------------------------------------------------------------------------------------------------


def connect(target: SshTarget, known_hosts: str, auto_add: bool = False,
            timeout: float = CONNECT_TIMEOUT) -> paramiko.SSHClient:
    """A logged-in client. Raises OpsctlError naming the host when it cannot connect or authenticate."""
    sock: paramiko.Channel | None = None
    jump: paramiko.SSHClient | None = None
    if target.bastion is not None:
        jump = connect(target.bastion, known_hosts, auto_add, timeout)
        try:
            transport = jump.get_transport()
            assert transport is not None
            sock = transport.open_channel("direct-tcpip", (target.address, target.port), ("127.0.0.1", 0),
                                          timeout=timeout)
        except GONE as exc:
            jump.close()
            raise ssh_error(target, exc, "reach (through the bastion)") from None
    client = _client(known_hosts, auto_add)
    try:
        client.connect(target.address, target.port, username=target.user, key_filename=target.key,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, sock=sock,
                       allow_agent=target.key is None, look_for_keys=target.key is None)
    except GONE as exc:
        client.close()
        if jump:
            jump.close()
        raise ssh_error(target, exc) from None
    if jump is not None:
        client._opsctl_jump = jump  # type: ignore[attr-defined]  # keep the bastion alive with the client
    return client


def _client(known_hosts: str, auto_add: bool) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    if Path(known_hosts).is_file():
        client.load_host_keys(known_hosts)
    policy = paramiko.AutoAddPolicy() if auto_add else paramiko.RejectPolicy()
    client.set_missing_host_key_policy(policy)
    return client


def close(client: paramiko.SSHClient) -> None:
    client.close()
    jump = getattr(client, "_opsctl_jump", None)
    if isinstance(jump, paramiko.SSHClient):
        jump.close()


def open_sftp(client: paramiko.SSHClient, target: SshTarget) -> paramiko.SFTPClient:
    """An SFTP session on the host: the login's own, or root's through sudo when the target becomes root (its
    reads see the node folders and /proc of the servers). Raises OpsctlError when sudo refuses."""
    if not target.become:
        return client.open_sftp()
    transport = client.get_transport()
    if transport is None:
        raise EOFError()
    channel = transport.open_session()
    channel.exec_command(sftp_server_command())
    try:
        return paramiko.SFTPClient(channel)
    except GONE:
        detail = channel.makefile_stderr("rb").read(4096).decode("utf-8", "replace").strip()
        channel.close()
        raise become_error(target, detail) from None


def run(client: paramiko.SSHClient, command: str, timeout: float = 60.0, become: bool = False) -> CommandResult:
    """Run a command, as root through sudo when become (never with a secret in it: the host's process list
    shows it)."""
    _stdin, stdout, stderr = client.exec_command(become_command(command) if become else command, timeout=timeout)
    out = stdout.read().decode("utf-8", "replace")
    err = stderr.read().decode("utf-8", "replace")
    return CommandResult(stdout.channel.recv_exit_status(), out, err)


def read_bytes(sftp: paramiko.SFTPClient, path: str, limit: int | None = None) -> bytes | None:
    """The file's bytes (the first `limit` of them when given); None when it does not exist."""
    try:
        with sftp.open(path, "rb") as handle:
            return bytes(handle.read(limit))
    except FileNotFoundError:
        return None


def read_file(sftp: paramiko.SFTPClient, path: str) -> str | None:
    data = read_bytes(sftp, path)
    return None if data is None else data.decode("utf-8", "replace")


def replace_file(sftp: paramiko.SFTPClient, path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace path atomically: a new temp file in its folder (created with mode, never through a link), then
    renamed over it (posix-rename@openssh.com), so a reader (Prometheus watching a file_sd file) never sees half."""
    folder, _, name = path.rpartition("/")
    temp = f"{folder}/.{name}.{secrets.token_hex(6)}.tmp"
    try:
        with sftp.open(temp, "wx") as handle:
            handle.chmod(mode)
            handle.write(data)
        sftp.posix_rename(temp, path)
    except BaseException:
        with contextlib.suppress(*GONE):
            sftp.remove(temp)
        raise


def readlink(sftp: paramiko.SFTPClient, path: str) -> str:
    """Where a link points ("" when it is gone or not ours to read: /proc/<pid>/cwd of another user's process)."""
    try:
        return sftp.readlink(path) or ""
    except OSError:
        return ""


def realpath(sftp: paramiko.SFTPClient, path: str) -> str | None:
    """path with every link resolved, as the host sees it; None when it does not exist."""
    try:
        return sftp.normalize(path)
    except OSError:
        return None


class Tunnel:
    """Forward 127.0.0.1:<local_port> to remote_address:remote_port as the SSH host sees it."""

    def __init__(self, client: paramiko.SSHClient, remote_address: str, remote_port: int) -> None:
        transport = client.get_transport()
        assert transport is not None
        self.transport = transport
        self.remote = (remote_address, remote_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.local_port: int = self.server.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"tunnel-{remote_port}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self.server.accept()
            except OSError:
                return
            try:
                channel = self.transport.open_channel("direct-tcpip", self.remote, peer)
            except GONE:
                conn.close()
                continue
            threading.Thread(target=pump, args=(conn, channel, self._closed), daemon=True).start()

    @property
    def active(self) -> bool:
        """Still forwarding: not closed, and its SSH connection is up."""
        return not self._closed.is_set() and self.transport.is_active()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self._thread.join(timeout=2)

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy(data: bytes, send: Callable[[bytes], object]) -> bool:
    if data:
        send(data)
    return bool(data)


def pump(conn: socket.socket, channel: paramiko.Channel, closed: threading.Event) -> None:
    """Copy bytes both ways until either side closes. Runs in its own thread, so nothing may escape it: paramiko
    raises EOFError (not OSError) for a channel whose SSH connection has gone."""
    try:
        while not closed.is_set():
            readable, _, _ = select.select([conn.fileno(), channel.fileno()], [], [], 0.2)
            if conn.fileno() in readable and not _copy(conn.recv(65536), channel.sendall):
                return
            if channel.fileno() in readable and not _copy(channel.recv(65536), conn.sendall):
                return
    except GONE:
        return
    finally:
        with contextlib.suppress(*GONE):
            channel.close()
        conn.close()
