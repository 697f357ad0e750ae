"""The local provider (embedded default): every node is a daemonized server process on this machine.

Each node owns `<state_dir>/<node>/` (mode 0700): its config (0600, the only place the password lives),
users.acl, log, pidfile, data, and opsctl's record. A pid is trusted only after /proc says it is a
Redis/Valkey server working in that node's folder and listening on its port: pids get reused. A missing or
stale pidfile is not taken as "down" either: /proc is searched for the node's server first.

The state dir and node folders are never followed through a symbolic link and must belong to opsctl's user
(or root); files are written through safefs (never through a link).

When opsctl runs as root, servers run as an unprivileged user (serveruser: server.user, default the flavor's
name): the state dir is opened to 0711 for it to pass through, each node folder and the files the server
reads or rewrites belong to it; opsctl's record stays root's.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.secrets import mask_text
from opsctl.net.connector import port_accepts
from opsctl.providers import sockdiag
from opsctl.providers.base import ProcessState, parse_record
from opsctl.providers.binaries import ServerBinary, server_environment
from opsctl.providers.serveruser import ServerUser, can_run, check_reachable, ensure, lookup
from opsctl.render import NodePaths, default_paths
from opsctl.render.directives import plaintext_port
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import FileProblem, check_state_path, make_dir, read_bounded, trusted_owners, write_private
from opsctl.state.statelock import parse_pid

STATE_FOLDER = ".opsctl"
RECORD = "opsctl-node.json"
SERVER_NAMES = ("redis-server", "valkey-server")
FLAVOR_USERS = ("valkey", "redis")  # server.user's defaults
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


@dataclass(frozen=True)
class ProcFacts:
    """What /proc says about a process: its executable, working directory and (retitled) command line."""

    pid: int
    exe: str
    cwd: str
    cmdline: tuple[str, ...]


# --- pure partners -----------------------------------------------------------------------------------------

def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """/proc/<pid>/cmdline as words; servers retitle themselves to 'binary addr:port [mode]' in one arg."""
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace")
    return tuple(text.split())


def is_node_process(facts: ProcFacts, binary: str, node_dir: str, conf: str, port: int,
                    plain_port: int | None = None) -> bool:
    """True when the process is a server (our binary or one by name) in node_dir, run with conf or on port (a
    TLS node with a plaintext port as well titles itself with that one)."""
    exe = facts.exe.removesuffix(" (deleted)")
    argv0 = facts.cmdline[0] if facts.cmdline else ""
    server = exe == os.path.realpath(binary) or os.path.basename(argv0) in (*SERVER_NAMES, os.path.basename(binary))
    ports = {f":{port}", f":{plain_port}"} if plain_port else {f":{port}"}
    ours = conf in facts.cmdline or any(word.endswith(tuple(ports)) for word in facts.cmdline[1:])
    return server and ours and facts.cwd == node_dir


def listening_inodes(table: str, address: str, port: int) -> set[str]:
    """Socket inodes listening on address:port (or on the wildcard) in a /proc/net/tcp or tcp6 table. Pure."""
    ip = ipaddress.ip_address(address.strip("[]"))
    words = [ip.packed[i:i + 4][::-1] for i in range(0, len(ip.packed), 4)]  # the kernel prints each word LE
    wanted = {f"{b''.join(words).hex().upper()}:{port:04X}", f"{'0' * len(ip.packed) * 2}:{port:04X}"}
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[3] == "0A" and fields[1] in wanted:  # 0A: LISTEN
            found.add(fields[9])
    return found


def start_hint(text: str, log: str, port: int) -> str:
    """The hint for a failed start, from what the server logged or printed."""
    return next((hint.format(port=port) for needle, hint in HINTS if needle in text), f"the full log is {log}")


def tail(text: str, lines: int = LOG_LINES) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-lines:]


def as_user(user: ServerUser | None, setpriv: str | None) -> list[str]:
    """The argv prefix that runs a server as user through setpriv (none when there is no user to switch to, or
    no setpriv: Popen switches itself then). Pure. Popen that switches user must fork opsctl, copying its page
    tables (~3-13 ms a server, serialised); without user arguments it may vfork, and setpriv switches instead."""
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


def read_proc(pid: int) -> ProcFacts | None:
    """None when the pid is gone, a zombie, or not ours to inspect."""
    base = Path(f"/proc/{pid}")
    try:
        if base.joinpath("stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X"):
            return None
        return ProcFacts(pid, os.readlink(base / "exe"), os.readlink(base / "cwd"),
                         parse_cmdline(base.joinpath("cmdline").read_bytes()))
    except (OSError, IndexError):
        return None


def holds_port(pid: int, address: str, port: int) -> bool:
    """Whether pid listens on address:port itself (a port that answers may be another process's). The listening
    sockets come from sock_diag, else /proc/net. True when neither can tell (or another user's fds): the port
    check alone decides then. False when pid is gone: a server that failed to bind the port another process holds
    exits right after it wrote its pidfile, and the other process's port accepts."""
    table = "tcp6" if ":" in address else "tcp"
    try:
        inodes = sockdiag.listening_inodes(address, port)
        if inodes is None:
            inodes = listening_inodes(Path(f"/proc/net/{table}").read_text(), address, port)
        fds = os.listdir(f"/proc/{pid}/fd")
        links = _fd_links(pid, fds)
    except FileNotFoundError:  # pid is gone
        return False
    except (OSError, ValueError):
        return True
    return not inodes or any(f"socket:[{inode}]" in links for inode in inodes)


def _fd_links(pid: int, fds: list[str]) -> set[str]:
    """What pid's fds point to; an fd closed since it was listed is left out (the listing's own, for opsctl)."""
    links = set()
    for fd in fds:
        try:
            links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue
    return links


RECORD_LIMIT = 1024 * 1024
PIDFILE_LIMIT = 64
READ_HINT = "the node's folder holds only what opsctl and the server wrote: remove the odd entry and run apply"


def read_text(path: Path, limit: int = RECORD_LIMIT) -> str | None:
    """A node file's text (None when missing); a link, a folder, a huge or unreadable file is a FileProblem."""
    return read_bounded(path, READ_HINT, limit)


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """This machine's range of source ports for outgoing connections; None when it cannot be read as one."""
    try:
        words = path.read_text(encoding="ascii").split()
        first, last = (int(w) for w in words)
    except (OSError, UnicodeError, ValueError):
        return None
    return (first, last) if 1 <= first <= last <= 65535 else None


def proc_cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
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


def plain_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise OpsctlError(f"not a plain file name: {name!r}", hint="node files live directly in the node's folder")
    return name


@dataclass
class Launch:
    """One start attempt: the launcher process (it forks the daemon and exits), its stderr, the log offset."""

    process: subprocess.Popen[bytes]
    stderr: IO[bytes]
    log_offset: int
    daemon: int | None = None


class LocalProvider:
    """Servers as daemonized processes on this machine (Linux: identities are checked through /proc)."""

    daemonize = True
    stages_files = False

    def __init__(self, loaded: LoadedSpec, state_dir: Path, binary: ServerBinary,
                 start_timeout: float = 30.0) -> None:
        self.loaded = loaded
        self.state_dir = Path(os.path.abspath(state_dir))  # never resolved: a link in it is refused, not followed
        self.binary = binary
        self.start_timeout = start_timeout
        self._user: ServerUser | None = None
        self._scan: tuple[float, dict[str, list[int]]] | None = None

    @staticmethod
    def default_state_dir(spec_file: str | Path, name: str) -> Path:
        """`<folder of the spec>/.opsctl/<name>`."""
        return Path(spec_file).resolve().parent / STATE_FOLDER / name

    def node_dir(self, node: Node) -> Path:
        return self.state_dir / node.name

    def paths(self, node: Node) -> NodePaths:
        return default_paths(str(self.state_dir), node)

    # --- files ---------------------------------------------------------------------------------------------

    def server_user(self) -> ServerUser | None:
        """Who the servers run as: None (opsctl's own user) unless opsctl is root; created when missing."""
        if os.geteuid() != 0:
            return None
        if self._user is None:
            user = ensure(self.loaded.spec.server.service_user)
            check_reachable(user, self.state_dir)  # before the first file is written
            self._user = user
            self.binary = self._runnable_binary(user)
            check_reachable(user, self.state_dir, self.binary.path)
        return self._user

    def _runnable_binary(self, user: ServerUser) -> ServerBinary:
        """The binary, or a copy of it in the state dir's bin/ when it lies where the server user cannot enter
        (the embedded server in a virtualenv under root's 0700 home): same bytes, root's, 0755."""
        if can_run(user, self.binary.path):
            return self.binary
        source = Path(self.binary.path)
        copy = self.state_dir / "bin" / source.name
        data = source.read_bytes()
        make_dir(self.state_dir, 0o711, trusted_owners())
        make_dir(copy.parent, 0o711, trusted_owners())
        if not _same_file(copy, data):
            write_private(copy, data, mode=0o755)
        return replace(self.binary, path=str(copy))

    def _owners(self) -> frozenset[int]:
        """Who may own a node folder: opsctl's user, root, and the server user (looked up, never created), or
        the other flavor's default user (a folder from before a flavor change; start hands it over)."""
        if os.geteuid() != 0:
            return trusted_owners()
        names = {self.loaded.spec.server.service_user, *FLAVOR_USERS}
        return trusted_owners(user.uid for name in names if (user := lookup(name)) is not None)

    def _folder(self, node: Node, hand_over: bool = False) -> Path:
        """The node's folder, made the server user's when missing. One that exists keeps its owner until the server
        starts (hand_over): a spec that changes the server user (a flavor change with the default user, redis ->
        valkey) writes the new files while the old server still runs as the old user, which must go on writing
        there (log, AOF, nodes.conf, its last RDB: Redis 7.0 does not exit on SIGTERM when it cannot save it, and
        was SIGKILLed 30 s later)."""
        user = self.server_user()
        check_state_path(self.state_dir, owners=trusted_owners())
        make_dir(self.state_dir, 0o711 if user else 0o700, trusted_owners())
        folder = self.node_dir(node)
        new = not os.path.lexists(folder)
        make_dir(folder, 0o700, self._owners(), chown=user.ids if user and (new or hand_over) else None)
        return folder

    def _checked_node_dir(self, node: Node) -> Path:
        """The node's folder, refused when it (or the state dir) is a link or someone else's."""
        folder = self.node_dir(node)
        check_state_path(folder, below=self.state_dir.parent, owners=self._owners())
        return folder

    def write_files(self, node: Node, files: dict[str, str]) -> None:
        """The files are the folder owner's (the running server's, which may rewrite its config) until the server
        starts as the spec's user (_hand_over)."""
        names = [plain_name(name) for name in files]
        folder = self._folder(node)
        owner = os.stat(folder) if self.server_user() else None
        for name in names:
            write_private(folder / name, files[name], chown=(owner.st_uid, owner.st_gid) if owner else None)

    def _hand_over(self, node: Node, user: ServerUser) -> None:
        """Give the server user what it writes in its folder (data, logs, configs of an earlier root run);
        opsctl's record stays root's. Links are changed themselves, never followed, and a file with a second
        hard link is left alone (it could be any file of the system, planted to be handed over)."""
        folder = self._folder(node, hand_over=True)
        for root, dirs, names in os.walk(folder):
            for name in [*dirs, *names]:
                path = os.path.join(root, name)
                st = os.lstat(path)
                hard_linked = stat.S_ISREG(st.st_mode) and st.st_nlink > 1
                if name != RECORD and st.st_uid != user.uid and not hard_linked:
                    os.chown(path, *user.ids, follow_symlinks=False)

    def read_file(self, node: Node, name: str) -> str | None:
        return read_text(self._checked_node_dir(node) / plain_name(name))

    def load_record(self, node: Node) -> dict[str, Any]:
        path = self._checked_node_dir(node) / RECORD
        return parse_record(read_text(path), node.name, str(path))

    def save_record(self, node: Node, record: dict[str, Any]) -> None:
        # one line: json's C encoder (indent= takes the pure-Python one, ~1 ms per record of 70 directives)
        write_private(self._folder(node) / RECORD, json.dumps(record, sort_keys=True) + "\n")

    def purge(self, node: Node) -> None:
        state = self._state(node, fresh=True)
        if state.running:
            raise RefusedError(f"refusing to delete the folder of {node.name}: its server runs as pid {state.pid}",
                               str(self.node_dir(node)), "stop the node first")
        folder = self._checked_node_dir(node)
        if folder.exists():
            shutil.rmtree(folder)
        self._drop_binary_copy_when_unused()

    def _drop_binary_copy_when_unused(self) -> None:
        """The state dir's bin/ (_runnable_binary's copy) goes with the last node folder of the spec."""
        if any(self.node_dir(n).exists() for n in self.loaded.layout.nodes):
            return
        copies = self.state_dir / "bin"
        if copies.is_dir() and not copies.is_symlink():
            shutil.rmtree(copies)

    def flush(self) -> None:
        """Files are written at once: nothing is staged."""

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
        return Launch(self._spawn(node, paths, stderr), stderr, file_size(Path(paths.log)))

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
        node's port only (a refused connect costs little); a node whose port accepts, and every FAILED_EVERY s
        each node, is looked at in /proc (~1 ms a node): polling 60 starting servers every 5 ms that way took most
        of a core from their own start-up. A round never sleeps less than it took."""
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
                reason = None if launch is None else self._start_failed(node, launch, state, codes[name], exits_seen)
                if reason is None and time.monotonic() >= deadline:
                    reason = f"it did not accept connections within {self.start_timeout:g} s"
                if reason is not None:
                    failed[name] = self._start_error(node, launch, reason)
                    del waiting[name]
            if waiting:
                time.sleep(max(POLL_SECONDS, time.monotonic() - began))

    def _start_failed(self, node: Node, launch: Launch, state: ProcessState, code: int | None,
                      exits_seen: float) -> str | None:
        """Why the start failed, or None while it may still succeed. code: the launcher's exit code, as seen
        before exits_seen."""
        if code is None or state.running:
            return None
        if code != 0:
            return f"the server exited with code {code}"
        if launch.daemon is None:
            launch.daemon = self._find_daemon(node, newer_than=exits_seen)
        if launch.daemon is None or read_proc(launch.daemon) is None:
            return "the server exited during start-up"
        return None

    def _find_daemon(self, node: Node, newer_than: float | None) -> int | None:
        """This node's server found through /proc (no pidfile needed): a server process in the node's folder
        run with its config or on its port. Candidates come from one scan of /proc, reused for SCAN_REUSE_S
        unless it is older than newer_than (a topology of many stopped nodes costs one scan, not one per node);
        each candidate is checked again now, so a reused scan can miss a server started since, never name a
        gone one."""
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
            found: dict[str, list[int]] = {}
            below = os.path.realpath(self.state_dir) + os.sep
            for entry in os.scandir("/proc"):
                if entry.name.isdigit() and (cwd := proc_cwd(int(entry.name))) and cwd.startswith(below):
                    found.setdefault(cwd, []).append(int(entry.name))
            self._scan = (now, found)
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


def _same_file(path: Path, data: bytes) -> bool:
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as handle:
            return handle.read(len(data) + 1) == data
    except OSError:
        return False
