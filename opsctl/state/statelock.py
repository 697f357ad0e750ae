"""One opsctl run per topology: an exclusive flock on `<state_dir>/.lock`, released when the run ends or dies.

flock belongs to the open file, so a crashed run never leaves a stale lock behind; the pid written into
the file only serves the error message of the run that was refused. named_lock is the same flock on another file
(a fleet's rollout), recording its holder's pid, host and since, and saying a record a killed run left.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import wait_for
from opsctl.state.safefs import LINK_HINT, FileProblem, make_dir, open_dir, rewrite_open, trusted_owners

LOCK_NAME = ".lock"
POLL_SECONDS = 0.01
# A run SIGKILLed while it spawned a process leaves that child holding the lock until its exec closes the fd
# (O_CLOEXEC): an instant, longer on a loaded machine. A refused run whose recorded holder is dead waits this long.
ORPHAN_GRACE_SECONDS = 5.0


def parse_pid(text: str | None) -> int | None:
    """The pid in a pidfile's or lock file's text, or None when it holds none."""
    word = (text or "").strip()
    return int(word) if word.isdigit() and int(word) > 0 else None


def pid_running(pid: int) -> bool:
    """A process with this pid runs on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_refused(state_dir: Path, holder: int | None) -> OpsctlError:
    who = f"pid {holder}" if holder else "pid unknown"
    return OpsctlError(f"another opsctl run holds the lock on {state_dir} ({who})",
                       f"lock file: {state_dir / LOCK_NAME}",
                       "wait until that run finishes (or stop it); the lock goes away with its process")


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(fd: int) -> int | None:
    try:
        return parse_pid(os.pread(fd, 32, 0).decode("ascii", "replace"))
    except OSError:
        return None


def _grace(recorded: int | None, timeout: float) -> float:
    """How long to wait for a lock whose record names `recorded`: at least the orphan grace when that run is dead."""
    return max(timeout, ORPHAN_GRACE_SECONDS) if recorded is not None and not pid_running(recorded) else timeout


class _StillHeld(Exception):
    """The lock stayed held for the whole wait."""


def _locked_within(fd: int, seconds: float) -> bool:
    """Took the flock on fd within `seconds` (one try when 0)."""
    try:
        wait_for(lambda: True if _try_lock(fd) else None, seconds, "a lock", POLL_SECONDS,
                 on_timeout=lambda _: _StillHeld())
    except _StillHeld:
        return False
    return True


def _acquire(fd: int, state_dir: Path, timeout: float) -> None:
    if not _try_lock(fd) and not _locked_within(fd, _grace(_holder(fd), timeout)):
        raise lock_refused(state_dir, _holder(fd))


def _open_lock(state_dir: Path, name: str = LOCK_NAME) -> int:
    """The lock file, opened inside the state dir's own fd and never through a link (root truncates it)."""
    with open_dir(state_dir, trusted_owners()) as folder:
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        except OSError as exc:
            raise FileProblem(state_dir / name, f"cannot be opened: {exc.strerror}", LINK_HINT) from None


@contextmanager
def state_lock(state_dir: Path, timeout: float = 0) -> Iterator[None]:
    """Hold the topology's lock for the block; refuse (OpsctlError) when another run holds it past timeout."""
    state_dir = Path(state_dir)
    make_dir(state_dir, 0o700, trusted_owners(), enforce=False)  # the local provider may have opened it to 0711
    fd = _open_lock(state_dir)
    try:
        _acquire(fd, state_dir, timeout)
        while not _still_there(fd, state_dir):  # a purge removed the file this run waited on: lock the one there now
            os.close(fd)
            fd = -1
            fd = _open_lock(state_dir)
            _acquire(fd, state_dir, timeout)
        rewrite_open(fd, state_dir / LOCK_NAME, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        if fd >= 0:
            os.close(fd)


def _still_there(fd: int, state_dir: Path) -> bool:
    """The locked file is the one the state dir names (remove_lock_file unlinks it under the lock: a run that
    waited on it holds a lock nobody else sees)."""
    try:
        named = os.stat(state_dir / LOCK_NAME, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def remove_lock_file(state_dir: Path) -> None:
    """Remove the lock file, while this run holds it (destroy --purge leaves no file of the topology): a run that
    waited on it finds it gone once it has it, and locks a new one (state_lock); no two runs ever hold both."""
    with open_dir(state_dir, trusted_owners()) as folder, suppress(FileNotFoundError):
        os.unlink(LOCK_NAME, dir_fd=folder)


@frozen
class Holder(Frozen):
    """Who holds a named lock (a fleet's rollout): its pid, host and since when (UTC), as its file records."""

    pid: int
    host: str
    since: str

    def record(self) -> bytes:
        return f"{self.pid} {self.host} {self.since}\n".encode()

    def text(self) -> str:
        return f"pid {self.pid} on {self.host}, since {self.since}"


def parse_holder(text: str) -> Holder | None:
    """The holder a lock file records ("PID HOST SINCE"), None for anything else (an empty file: released)."""
    words = text.split()
    pid = parse_pid(words[0]) if len(words) == 3 else None
    return Holder(pid, words[1], words[2]) if pid is not None else None


def _holder_here(fd: int) -> int | None:
    """The pid a named lock's record names, when that run is of this host."""
    import socket

    holder = parse_holder(os.pread(fd, 256, 0).decode("ascii", "replace"))
    return holder.pid if holder is not None and holder.host == socket.gethostname() else None


@contextmanager
def named_lock(folder: Path, name: str, what: str, mode: int = 0o700) -> Iterator[Holder | None]:
    """Hold folder/name for the block, the holder (pid, host, since) recorded in it; another run holding it: refused
    naming that holder. Yields the holder a run that died left recorded (SIGKILLed: its flock went with it, its
    record stayed), taken over, for the caller to say; None when the lock was free and clean."""
    import socket
    from datetime import datetime, timezone

    make_dir(folder, mode, trusted_owners(), enforce=False)
    fd = _open_lock(folder, name)
    try:
        if not _try_lock(fd) and not _locked_within(fd, _grace(_holder_here(fd), 0)):
            holder = parse_holder(os.pread(fd, 256, 0).decode("ascii", "replace"))
            raise OpsctlError(f"another opsctl run holds {what} ({holder.text() if holder else 'holder unknown'})",
                              f"lock file: {folder / name}",
                              "wait until that run finishes (or stop it); the lock goes away with its process")
        found = parse_holder(os.pread(fd, 256, 0).decode("ascii", "replace"))  # read under the lock: a leftover
        since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        rewrite_open(fd, folder / name, Holder(os.getpid(), socket.gethostname(), since).record())
        try:
            yield found
        finally:
            os.ftruncate(fd, 0)  # released cleanly: no record left to take over
    finally:
        os.close(fd)
