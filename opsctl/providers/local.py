"""The local provider (embedded default): every node is a daemonized server process on this machine.

Files are LocalFiles'; this module starts and stops the servers. A pid counts only once /proc shows the node's
server in its folder, on its port (providers.proc): pids get reused. A missing or stale pidfile is not "down"
either: /proc is searched for the node's server first.
"""

from __future__ import annotations

import functools
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.secrets import mask_text
from opsctl.net.connector import port_accepts
from opsctl.providers.base import ProcessState
from opsctl.providers.binaries import ServerBinary, server_environment
from opsctl.providers.localfiles import LocalFiles, ServerUser, empty_but_record, read_text
from opsctl.providers.proc import ProcFacts, holds_port, is_node_process, read_proc, working_below
from opsctl.render import NodePaths
from opsctl.render.directives import plaintext_port
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import FileProblem
from opsctl.state.statelock import parse_pid

POLL_SECONDS = 0.005
FAILED_EVERY = 0.05  # s: how often a start not up yet is looked at for a failure (its /proc facts, its launcher)
LOG_LINES = 10
KILL_WAIT = 5.0
# s: SIGTERM is sent again this often until the stop's timeout: a server drops one it cannot act on yet (Redis 7.0
# right after a full sync: "Writing initial AOF, can't exit.") and would otherwise wait for the SIGKILL
TERM_AGAIN = 1.0
SCAN_REUSE_S = 1.0

HINTS = (
    ("Address already in use", "port in use by another process: `ss -ltnp 'sport = :{port}'` shows which; "
                               "stop it or give the node another port"),
    ("Cannot assign requested address", "the address is not configured on this machine; check hosts[].address"),
    ("FATAL CONFIG FILE ERROR", "the server rejected a directive in its config (see above): does this binary "
                                "match server.flavor/server.version?"),
    ("Permission denied", "the server cannot read or write a file in its folder; check owners and modes"),
)
PIDFILE_LIMIT = 64


# --- pure partners -----------------------------------------------------------------------------------------

def start_hint(text: str, log: str, port: int) -> str:
    """The hint for a failed start, from what the server logged or printed; the port in use is the one the server
    names (its bus port, say), else the node's own."""
    taken = BIND_FAILED.search(text)
    port = int(taken.group(1)) if taken else port
    return next((hint.format(port=port) for needle, hint in HINTS if needle in text), f"the full log is {log}")


# "Could not create server TCP listening socket 127.0.0.1:20441: bind: Address already in use" (Redis, Valkey)
BIND_FAILED = re.compile(r":(\d{1,5}): bind: Address already in use")


def tail(text: str, lines: int = LOG_LINES) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-lines:]


def as_user(user: ServerUser | None, setpriv: str | None) -> list[str]:
    """The argv prefix that runs a server as user through setpriv (none when there is no user to switch to, or
    no setpriv: Popen switches itself then). Pure. Why: Popen that switches user must fork opsctl, copying its
    page tables; without user arguments it may vfork."""
    if user is None or setpriv is None:
        return []
    return [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--"]


def start_command(binary: str, node: Node, conf: str) -> list[str]:
    return [binary, conf, "--sentinel"] if node.is_sentinel else [binary, conf]

# --- I/O helpers -------------------------------------------------------------------------------------------

SETPRIV = ("/usr/bin/setpriv", "/bin/setpriv")


@functools.cache
def setpriv() -> str | None:
    """util-linux's setpriv at a fixed path, root's and writable by root alone; None when there is none."""
    for path in SETPRIV:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022 and st.st_mode & 0o100:
            return path
    return None


def log_since(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class Launch:
    """One start attempt: the launcher process (it forks the daemon and exits), its stderr, the log offset."""

    process: subprocess.Popen[bytes]
    stderr: IO[bytes]
    log_offset: int
    daemon: int | None = None


class LocalProvider(LocalFiles):
    """Servers as daemonized processes on this machine (Linux: identities are checked through /proc)."""

    daemonize = True
    stages_files = False

    def __init__(self, loaded: LoadedSpec, state_dir: Path, binary: ServerBinary,
                 start_timeout: float = 30.0) -> None:
        super().__init__(loaded, state_dir, binary)
        self.start_timeout = start_timeout
        self._scan: tuple[float, dict[str, list[int]]] | None = None

    def close(self) -> None:
        """Nothing to release: servers outlive the provider on purpose."""

    # --- processes -----------------------------------------------------------------------------------------

    def _is_ours(self, node: Node, facts: ProcFacts) -> bool:
        paths = self.paths(node)
        return is_node_process(facts, self.binary.path, os.path.realpath(paths.dir), paths.conf, node.port,
                               plaintext_port(self.loaded.spec, node))

    def process_state(self, node: Node) -> ProcessState:
        """Running when the pidfile names this node's server, or when /proc shows one in the node's folder
        (a deleted or stale pidfile never makes a live server look down)."""
        return self._state(node, fresh=False)

    def _state(self, node: Node, fresh: bool) -> ProcessState:
        """process_state; fresh: from a new scan of /proc (before stopping, starting or deleting anything)."""
        state = self._pidfile_state(node)
        if state.running:
            return state
        pid = self._find_daemon(node, time.monotonic() if fresh else None)
        if pid is not None:
            return ProcessState(node.name, True, pid, f"running as pid {pid} (found through /proc; {state.detail})")
        return state

    def _pidfile_state(self, node: Node) -> ProcessState:
        pidfile = Path(self.paths(node).pid)
        try:
            text = read_text(pidfile, PIDFILE_LIMIT)
        except FileProblem as problem:
            return ProcessState(node.name, False, None, problem.summary)
        if text is None:
            return ProcessState(node.name, False, None, "not running (no pidfile)")
        pid = parse_pid(text)
        if pid is None:
            return ProcessState(node.name, False, None, f"pidfile {pidfile} holds no pid")
        facts = read_proc(pid)
        if facts is None:
            return ProcessState(node.name, False, None, f"pidfile names dead pid {pid}")
        if not self._is_ours(node, facts):
            return ProcessState(node.name, False, None,
                                f"pidfile names pid {pid}, which is not this node's server ({facts.exe})")
        return ProcessState(node.name, True, pid, f"running as pid {pid}")

    def start(self, node: Node) -> None:
        """Launch the server (it daemonizes) and return once its pidfile names it and its port accepts."""
        failed = self.start_many([node])
        if failed:
            raise failed[node.name]

    def start_many(self, nodes: Sequence[Node], launched: Callable[[], None] | None = None) -> dict[str, OpsctlError]:
        """Launch every node's server at once (one fork each), then wait for all of them in one poll loop: a node
        is up once its pidfile names its server, its port accepts and that server holds the port itself.
        launched is called between the two. Returns the nodes that did not come up, with why (every launch has
        ended one way or the other by then)."""
        failed: dict[str, OpsctlError] = {}
        waiting: dict[str, tuple[Node, Launch | None]] = {}
        with ExitStack() as stack:
            for node in nodes:
                try:
                    waiting[node.name] = (node, self._launch(node, stack))
                except OpsctlError as exc:
                    failed[node.name] = exc
            if launched is not None:
                launched()
            self._wait_until_up(waiting, failed)
        self._scan = None  # it predates the servers just started: a later look through /proc scans again
        return failed

    def _launch(self, node: Node, stack: ExitStack) -> Launch | None:
        """Spawn the node's server; None when it runs already (a reused scan: a duplicate start fails to bind,
        harmlessly)."""
        paths = self.paths(node)
        if self.process_state(node).running:
            return None
        if not Path(paths.conf).is_file():
            raise OpsctlError(f"cannot start {node.name}: no config at {paths.conf}",
                              hint="write the node's files first (`opsctl apply` does)")
        self._drop_pidfile(node)
        stderr = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (closed by the stack)
        # the log's size before the spawn: a daemon can log its failure and exit before this process runs again
        log_offset = file_size(Path(paths.log))
        return Launch(self._spawn(node, paths, stderr), stderr, log_offset)

    def _spawn(self, node: Node, paths: NodePaths, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
        """New session, no terminal, no inherited fds, a scrubbed environment, umask 077 for its files; as root,
        the server user's ids and no supplementary groups."""
        env = server_environment(os.environ, self.loaded.credentials.all())
        user = self.server_user()
        if user is not None:
            self._hand_over(node, user)
        command = start_command(self.binary.path, node, paths.conf)
        switch = as_user(user, setpriv())
        itself = None if switch else user  # no setpriv: Popen switches (and forks)
        try:
            return subprocess.Popen([*switch, *command], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=stderr, cwd=paths.dir, env=env, start_new_session=True, close_fds=True,
                                    umask=0o077, user=itself.uid if itself else None,
                                    group=itself.gid if itself else None, extra_groups=[] if itself else None)
        except OSError as exc:
            raise OpsctlError(f"cannot run {self.binary.path} for {node.name}", str(exc),
                              "check server.binary and its permissions") from None

    def _wait_until_up(self, waiting: dict[str, tuple[Node, Launch | None]],
                       failed: dict[str, OpsctlError]) -> None:
        """Poll every launched node until it is up or failed; one /proc scan per round at most. A round asks each
        node's port only; a node whose port accepts, and every node every FAILED_EVERY, is looked at in /proc. A
        round never sleeps less than it took. Why: a refused connect costs little, a look in /proc much more."""
        # not poll.wait_for: a timeout fails each node still waiting on its own (with its log), and a round sleeps
        # as long as it took, not a fixed interval
        deadline = time.monotonic() + self.start_timeout
        looked = float("-inf")
        while waiting:
            began = time.monotonic()
            look = began - looked >= FAILED_EVERY
            if look:
                looked = began
                codes = {name: launch.process.poll() for name, (_, launch) in waiting.items() if launch is not None}
                exits_seen = time.monotonic()  # a daemon forked by a launcher seen exited is in any later scan
            for name, (node, launch) in list(waiting.items()):
                accepts = port_accepts(node.address, node.port)
                if not accepts and not look:
                    continue
                state = self.process_state(node) if launch is None else self._pidfile_state(node)
                if state.running and accepts and (
                        launch is None or state.pid is None or holds_port(state.pid, node.address, node.port)):
                    del waiting[name]
                    continue
                if not look:
                    continue
                reason = None if launch is None else \
                    self._start_failed(node, launch, state, codes[name], exits_seen, deadline)
                if reason is None and time.monotonic() >= deadline:
                    reason = f"it did not accept connections within {self.start_timeout:g} s"
                if reason is not None:
                    failed[name] = self._start_error(node, launch, reason)
                    del waiting[name]
            if waiting:
                time.sleep(max(POLL_SECONDS, time.monotonic() - began))

    def _start_failed(self, node: Node, launch: Launch, state: ProcessState, code: int | None,
                      exits_seen: float, deadline: float) -> str | None:
        """Why the start failed, or None while it may still succeed. code: the launcher's exit code, as seen
        before exits_seen."""
        if code is None or state.running:
            return None
        if code != 0:
            return f"the server exited with code {code}"
        if launch.daemon is None:
            launch.daemon = self._find_daemon(node, newer_than=exits_seen)
        if launch.daemon is None:
            return self._daemon_unseen(node, launch, state, deadline)
        if read_proc(launch.daemon) is None:
            return "the server exited during start-up"
        return None

    def _daemon_unseen(self, node: Node, launch: Launch, state: ProcessState, deadline: float) -> str | None:
        """The launcher exited 0 and no scan of /proc showed its daemon yet. One scan can miss it (a start that
        went on to succeed was failed by one), so each later round scans again, until the start deadline: None
        meanwhile. Unless the server said it is gone: its pidfile names a dead pid, or its log since the launch
        has a line a failed start writes (HINTS: a port in use fails now, not at the deadline)."""
        said = log_since(Path(self.paths(node).log), launch.log_offset)
        if state.detail.startswith("pidfile names dead pid") or any(needle in said for needle, _ in HINTS):
            return "the server exited during start-up"
        if time.monotonic() >= deadline:
            return f"the server exited during start-up (no daemon of it seen in /proc within {self.start_timeout:g} s)"
        return None

    def _find_daemon(self, node: Node, newer_than: float | None) -> int | None:
        """This node's server found through /proc (no pidfile needed): a server process in the node's folder
        run with its config or on its port. Candidates come from one /proc scan, reused for SCAN_REUSE_S unless
        older than newer_than (many stopped nodes cost one scan); each is checked again now, so a reused scan can
        miss a server started since, never name a gone one."""
        folder = os.path.realpath(self.paths(node).dir)
        if not os.path.isdir(folder):  # a new node: no process can work in a folder that does not exist
            return None
        for pid in self._processes_in(newer_than).get(folder, ()):
            if (facts := read_proc(pid)) and self._is_ours(node, facts):
                return facts.pid
        return None

    def _processes_in(self, newer_than: float | None) -> dict[str, list[int]]:
        """Working directory -> pids, for the processes working under the state dir."""
        now = time.monotonic()
        if self._scan is None or now - self._scan[0] > SCAN_REUSE_S or \
                (newer_than is not None and self._scan[0] < newer_than):
            self._scan = (now, working_below(os.path.realpath(self.state_dir)))
        return self._scan[1]

    def _start_error(self, node: Node, launch: Launch | None, reason: str) -> OpsctlError:
        paths = self.paths(node)
        log = log_since(Path(paths.log), launch.log_offset if launch else 0)
        err = ""
        if launch is not None:
            launch.stderr.seek(0)
            err = launch.stderr.read().decode("utf-8", "replace")
        lines = [f"command: {' '.join(start_command(self.binary.path, node, paths.conf))}"]
        lines += [f"last lines of {paths.log}:", *(f"  {line}" for line in tail(log))] if tail(log) else \
            [f"{paths.log}: nothing new"]
        lines += ["stderr:", *(f"  {line}" for line in tail(err))] if tail(err) else []
        detail = mask_text("\n".join(lines), self.loaded.credentials.all())
        return OpsctlError(f"{node.name} did not start at {node.endpoint}: {reason}", detail,
                           start_hint(log + err, paths.log, node.port))

    def stop(self, node: Node, timeout: float = 30.0) -> None:
        """SIGTERM this node's server (never a reused pid), SIGKILL after timeout; drop a stale pidfile."""
        state = self._state(node, fresh=True)
        if state.running and state.pid is not None:
            self._terminate(node, state.pid, timeout)
        self._drop_pidfile(node)

    def _drop_pidfile(self, node: Node) -> None:
        if self.node_dir(node).is_dir():
            Path(self._checked_node_dir(node) / Path(self.paths(node).pid).name).unlink(missing_ok=True)

    def purge(self, node: Node, keep_record: bool = False) -> None:
        state = self._state(node, fresh=True)
        if state.running:
            raise RefusedError(f"refusing to delete the folder of {node.name}: its server runs as pid {state.pid}",
                               str(self.node_dir(node)), "stop the node first")
        folder = self._checked_node_dir(node)
        if keep_record:
            empty_but_record(folder)
        elif folder.exists():
            shutil.rmtree(folder)
        self._drop_binary_copy_when_unused()

    def _terminate(self, node: Node, pid: int, timeout: float) -> None:
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            facts = read_proc(pid)  # checked again with the pidfd held: the pid cannot change owner now
            if facts is None or not self._is_ours(node, facts):
                return
            if stop_process(handle, timeout):
                return
        finally:
            os.close(handle)
        raise OpsctlError(f"{node.name} (pid {pid}) did not exit, even after SIGKILL",
                          hint="the process may be stuck in the kernel (D state); check `ps -o stat -p PID`")


def stop_process(pidfd: int, timeout: float) -> bool:
    """SIGTERM, sent again every TERM_AGAIN seconds until timeout, then SIGKILL: True once the process is gone."""
    # not poll.wait_for: each wait blocks on the pidfd itself, and running out of time sends SIGKILL, not an error
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if _signalled_and_gone(pidfd, signal.SIGTERM, min(TERM_AGAIN, left)):
            return True
    return _signalled_and_gone(pidfd, signal.SIGKILL, KILL_WAIT)


def _signalled_and_gone(pidfd: int, sig: signal.Signals, wait: float) -> bool:
    """Send sig, then wait up to wait seconds: True once the process is gone."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return True
    return bool(select.select([pidfd], [], [], wait)[0])

