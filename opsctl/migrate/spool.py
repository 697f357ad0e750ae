"""The stream that arrives while a shard's snapshot is copied, kept in a private file until it is applied.

The link to the source stays attached through the copy (a thread reads it into the spool), so the source's
backlog need not hold the copy's writes: at 10k writes/s a default 1 MB backlog holds about two seconds of them,
and a copy that outlasts it could only start over. Invariant: the file holds the stream from the snapshot's
position on, whole commands in order, each with the offset just after it; a command cut off by a kill is dropped
on the next open. The file is read back validated: a spool that is not this snapshot's is refused by name.
"""

from __future__ import annotations

import os
import threading
from contextlib import suppress
from pathlib import Path

from opsctl.base.errors import OpsctlError
from opsctl.net.rawpipe import PIPE_ERRORS
from opsctl.net.resp import encode
from opsctl.state.safefs import disk_full, open_dir, write_all
from opsctl.stream.framing import Entry, Position, StreamProtocolError, frame
from opsctl.stream.reader import Stream

MAGIC = b"opsctl-spool-1"
READ_CHUNK = 4 << 20
HINT = "remove it and run again: the shard's stream is then read from the source's backlog"


class Spool:
    """The spool file of one source shard's snapshot at start (a Position; None: as its header says, for a run
    that resumes after the copy and knows only the position applied)."""

    def __init__(self, path: Path, start: Position | None) -> None:
        self.path, self.start = path, start or Position("", 0)
        self._known = start is not None
        self._read_at = 0  # the byte where the next read begins
        self._buffer = b""
        self.end = self.start.offset  # the offset after the last command read
        self._header_seen = False

    # -- writing -----------------------------------------------------------------------------------------------

    def create(self) -> int:
        """A new spool (any old one removed); returns its fd for appending."""
        with open_dir(self.path.parent) as folder, suppress(FileNotFoundError):
            os.unlink(self.path.name, dir_fd=folder)
        fd = self._open(os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        write_all(fd, encode((MAGIC, self.start.replid.encode(), b"%d" % self.start.offset)))
        return fd

    def reopen(self) -> tuple[int, int]:
        """The existing spool for appending, after its last whole command (a command cut off by a kill is cut
        away), and the offset the stream continues from (after that command)."""
        kept = self._scan_whole()
        continue_at = self.end
        fd = self._open(os.O_WRONLY)
        os.ftruncate(fd, kept)
        os.lseek(fd, 0, os.SEEK_END)
        self._read_at, self._buffer, self._header_seen = 0, b"", False
        self.end = self.start.offset
        return fd, continue_at

    def _open(self, flags: int) -> int:
        """The spool itself, never a link's target (O_NOFOLLOW in a folder opened the same way)."""
        try:
            with open_dir(self.path.parent) as folder:
                return os.open(self.path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        except OSError as exc:
            raise OpsctlError(f"{self.path}: cannot be opened: {exc.strerror}", hint=HINT) from None

    def exists(self) -> bool:
        return self.path.is_file() and not self.path.is_symlink()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------------------------------------------

    def read(self) -> list[Entry]:
        """The whole commands written since the last read, in order."""
        fd = self._open(os.O_RDONLY)
        try:
            os.lseek(fd, self._read_at, os.SEEK_SET)
            while chunk := os.read(fd, READ_CHUNK):
                self._buffer += chunk
                self._read_at += len(chunk)
        finally:
            os.close(fd)
        return self._parse()

    def _scan_whole(self) -> int:
        """Reads the whole file; returns the length of its whole records (the header first)."""
        self._read_at, self._buffer, self._header_seen = 0, b"", False
        self.end = self.start.offset
        self.read()
        return self._read_at - len(self._buffer)

    def _parse(self) -> list[Entry]:
        try:
            framed, used = frame(self._buffer, 0)
        except StreamProtocolError as exc:
            raise OpsctlError(f"{self.path}: not a spool opsctl wrote", exc.summary, HINT) from None
        self._buffer = self._buffer[used:]
        entries: list[Entry] = []
        for args, _length in framed:
            if not self._header_seen:
                self._check_header(args)
                continue
            entries.append(self._entry(args))
        return entries

    def _check_header(self, args: tuple[bytes, ...]) -> None:
        if len(args) != 3 or args[0] != MAGIC:
            raise OpsctlError(f"{self.path}: not a spool opsctl wrote", "its first record is not a spool header",
                              HINT)
        if not self._known and args[2].isdigit():
            self.start, self.end = Position(args[1].decode("utf-8", "replace"), int(args[2])), int(args[2])
        if (args[1].decode("utf-8", "replace"), args[2]) != (self.start.replid, b"%d" % self.start.offset):
            raise OpsctlError(f"{self.path}: a spool of another snapshot",
                              f"it starts at {args[1][:40].decode('utf-8', 'replace')} {args[2][:20].decode()}, the "
                              f"journal's snapshot at {self.start.replid} {self.start.offset}", HINT)
        self._header_seen = True

    def _entry(self, args: tuple[bytes, ...]) -> Entry:
        if len(args) < 3 or not args[0].isdigit() or int(args[0]) <= self.end:
            raise OpsctlError(f"{self.path}: a record out of order", f"after offset {self.end}: "
                              f"{args[0][:20]!r}", HINT)
        try:
            arrived = float(args[1])
        except ValueError:
            raise OpsctlError(f"{self.path}: a record without its arrival time", repr(args[1][:20]), HINT) from None
        self.end = int(args[0])
        return Entry(args[2:], self.end, arrived)


class SpoolWriter:
    """A thread reading an attached stream into the spool until stopped; the stream stays open for the caller.
    A lost link ends the thread quietly (the caller re-attaches from the spool's end); a failed write is raised
    by stop()."""

    def __init__(self, stream: Stream, spool: Spool, fd: int) -> None:
        self.stream, self.spool, self._fd = stream, spool, fd
        self._stop = threading.Event()
        self.lost: str | None = None  # why the link ended, when it did
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"spool {spool.path.name}", daemon=True)

    def start(self) -> SpoolWriter:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    entries = self.stream.read(0.1)
                except (*PIPE_ERRORS, StreamProtocolError) as exc:
                    self.lost = f"{type(exc).__name__}: {exc}"
                    return
                if entries:
                    self._write(entries)
                    self.stream.ack(entries[-1].end)
        except BaseException as exc:  # handed to the caller by stop()
            self._failed = exc

    def _write(self, entries: list[Entry]) -> None:
        try:
            write_all(self._fd, b"".join(encode((b"%d" % e.end, b"%.6f" % e.arrived, *e.args)) for e in entries))
        except OSError as exc:
            raise disk_full(self.spool.path, exc, None) or OpsctlError(
                f"{self.spool.path}: cannot be written: {exc.strerror}", hint="free the disk, then re-run: it "
                "resumes") from None

    def stop(self) -> bool:
        """Stops the thread (once; again, a no-op); whether the stream is still attached after the spool's last
        command."""
        self._stop.set()
        self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._failed is not None:
            raise self._failed
        return self.lost is None

    def abandon(self) -> None:
        """For a run that fails: the thread stopped whatever it ran into, the link closed."""
        with suppress(Exception):
            self.stop()
        self.stream.close()
