"""The local provider's redis_exporters (metrics.exporter): one per server and Sentinel, in the node's folder, as
its user.

An exporter is the node's only when /proc shows the binary working in that folder (pids get reused); its start
digest lies in exporter.state. The password reaches it through exporter-password.json (0600) alone: never argv,
never the environment (emptied)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from opsctl.base.errors import OpsctlError
from opsctl.base.poll import Pending, wait_for
from opsctl.base.secrets import mask_text
from opsctl.metrics.exporter import EXPORTER_BINARY, EXPORTER_PACKAGE, PASSWORD_FILE, ExporterRun
from opsctl.net.connector import port_accepts
from opsctl.providers.local import KILL_WAIT, LocalProvider, as_user, setpriv, stop_process, tail
from opsctl.providers.proc import holds_port, read_proc, working_below
from opsctl.spec.layout import Node, exporter_port
from opsctl.state.safefs import FileProblem, write_private

STATE_FILE = "exporter.state"
LOG_FILE = "exporter.log"
START_TIMEOUT = 10.0
ENVIRONMENT = {"PATH": "/usr/bin:/bin"}  # nothing of opsctl's: the exporter reads REDIS_PASSWORD and more from it


def exporter_binary() -> str:
    """The Debian package's exporter, or an error naming the package."""
    if not os.access(EXPORTER_BINARY, os.X_OK):
        raise OpsctlError(f"metrics.exporter is on, but there is no redis_exporter at {EXPORTER_BINARY}",
                          hint=f"install Debian's {EXPORTER_PACKAGE} (apt-get install {EXPORTER_PACKAGE}), "
                               "or set metrics.exporter: false")
    return EXPORTER_BINARY


class LocalExporters:
    """Start, stop and look at the exporters of a LocalProvider's nodes."""

    def __init__(self, provider: LocalProvider) -> None:
        self.provider = provider

    def renew_tls(self) -> None:
        """Nothing: a local exporter reads the node's own TLS files, which `tls rotate` renewed in place."""

    def _pids(self, node: Node, working: Mapping[str, list[int]] | None = None) -> list[int]:
        """The exporters working in the node's folder; working: a /proc scan of the state dir made for several
        nodes (working_below), else one is made for this node."""
        folder = os.path.realpath(self.provider.node_dir(node))
        if not os.path.isdir(folder):
            return []
        binary = os.path.realpath(EXPORTER_BINARY)
        if working is None:
            working = working_below(os.path.realpath(self.provider.state_dir))
        return [pid for pid in working.get(folder, []) if (facts := read_proc(pid)) and facts.cwd == folder and
                facts.exe.removesuffix(" (deleted)") == binary]

    def state(self, node: Node, working: Mapping[str, list[int]] | None = None) -> str | None:
        """The digest the node's running exporter was started with; None when none runs ("" when one runs whose
        start opsctl did not finish recording: it is restarted)."""
        if not self._pids(node, working):
            return None
        try:
            text = self.provider.read_file(node, STATE_FILE)
        except FileProblem:
            return ""
        return (text or "").strip()

    def states(self, nodes: Sequence[Node]) -> list[str | None]:
        """state of each node, from one /proc scan (a scan per node reads every process's cwd each time)."""
        working = working_below(os.path.realpath(self.provider.state_dir))
        return [self.state(node, working) for node in nodes]

    def start(self, node: Node, run: ExporterRun) -> None:
        """Stop the node's exporter, write its password file, start it with run's arguments as the server's user and
        return once its port accepts; then record run's digest."""
        binary = exporter_binary()
        self.stop(node)
        self.provider.write_files(node, {PASSWORD_FILE: run.password_file})
        folder = self.provider.node_dir(node)
        user = self.provider.server_user()
        log = folder / LOG_FILE
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            if user is not None:
                os.fchown(fd, *user.ids)
            offset = os.fstat(fd).st_size
            switch = as_user(user, setpriv())
            itself = None if switch else user
            process = subprocess.Popen(
                [*switch, binary, *run.args], stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd=folder,
                env=ENVIRONMENT, start_new_session=True, close_fds=True, umask=0o077,
                user=itself.uid if itself else None, group=itself.gid if itself else None,
                extra_groups=[] if itself else None)
        finally:
            os.close(fd)
        port = exporter_port(node, self.provider.loaded.spec.metrics.port_offset)

        def up() -> bool | Pending:
            if process.poll() is not None:
                raise self._failed(node, run, log, offset, f"it exited with code {process.returncode}")
            if not port_accepts(node.address, port):
                return Pending(f"port {port} does not accept yet")
            # another process's port accepts too: the exporter exits once it fails to bind (poll above)
            return True if holds_port(process.pid, node.address, port) else Pending(
                f"port {port} accepts, but not on the exporter's socket")

        what = f"the redis_exporter of {node.name} to listen on {node.address}:{port}"
        try:
            wait_for(up, START_TIMEOUT, what, 0.02, on_timeout=lambda _: self._failed(
                node, run, log, offset, f"timed out after {START_TIMEOUT:g}s waiting for {what}"))
        except OpsctlError:
            self.stop(node)
            raise
        write_private(folder / STATE_FILE, run.digest + "\n")

    def _failed(self, node: Node, run: ExporterRun, log: Path, offset: int, reason: str) -> OpsctlError:
        text = ""
        try:
            with log.open("rb") as handle:
                handle.seek(offset)
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            pass
        lines = [f"command: {EXPORTER_BINARY} {' '.join(run.args)}", f"last lines of {log}:",
                 *(f"  {line}" for line in tail(text))]
        detail = mask_text("\n".join(lines), [*self.provider.loaded.credentials.all(), run.password])
        return OpsctlError(f"the redis_exporter of {node.name} did not start: {reason}", detail,
                           "`ss -ltnp` shows who holds its port (metrics.port_offset moves it)"
                           if "address already in use" in text else f"the full log is {log}")

    def stop(self, node: Node, timeout: float = KILL_WAIT) -> None:
        """SIGTERM the node's exporters (SIGKILL after timeout); drop their recorded digest."""
        for pid in self._pids(node):
            try:
                handle = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                facts = read_proc(pid)  # again with the pidfd held: the pid cannot change owner now
                if facts is not None and facts.exe.removesuffix(" (deleted)") == os.path.realpath(EXPORTER_BINARY):
                    stop_process(handle, timeout)
            finally:
                os.close(handle)
        if self.provider.node_dir(node).is_dir():
            self.provider._checked_node_dir(node).joinpath(STATE_FILE).unlink(missing_ok=True)

    def remove(self, node: Node) -> None:
        """Stop the exporter and delete its password file (destroy: no secret stays behind for a stopped node)."""
        self.stop(node)
        if self.provider.node_dir(node).is_dir():
            self.provider._checked_node_dir(node).joinpath(PASSWORD_FILE).unlink(missing_ok=True)
