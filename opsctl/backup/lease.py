"""One archiver per topology and location: a lease object (`lease/<spec>.json`: owner, host, pid, start and last
renewal) that the archiver writes when it starts and renews while it runs.

A second archiver refuses (exit 3) while the lease is fresh, naming the holder and its last renewal; a lease not
renewed for STALE_AFTER seconds, or held by a process of this host that is gone, is taken over, said as such. A
holder that finds another owner in the lease at a renewal stops (exit 3) without writing another segment. In a
folder the holder also keeps the folder's flock (opsctl.state.statelock) on `lease/<spec>/.lock`: on one machine a
live holder is known at once, even before its first write.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from typing import Annotated, ClassVar

from opsctl.backup.manifest import utc_iso
from opsctl.backup.store import FolderStore, Store
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit, Note
from opsctl.base.frozen import frozen
from opsctl.base.record import Range, Versioned, stored_time
from opsctl.base.stop import Stopped
from opsctl.net.fanout import Borrowed
from opsctl.state.safefs import FileProblem, make_dir, trusted_owners
from opsctl.state.statelock import pid_running, state_lock

LEASE_FOLDER = "lease"
RENEW_EVERY = 5.0  # s between renewals
STALE_AFTER = 30.0  # s without a renewal: the holder is taken for gone
SETTLE = 0.5  # s between writing a new lease and reading it back: an archiver starting at the same moment shows
HINT = ("stop the other archiver first (`systemctl stop opsctl-archive@<spec>`), or give this one its own --to; a "
        f"lease not renewed for {STALE_AFTER:.0f}s is taken over")


MAX_PID = 1 << 22  # Linux's highest pid_max


@frozen
class LeaseRecord(Versioned):
    """The lease object (lease_json). Read back by its types (a pid os.kill cannot take is none); keys a later
    opsctl adds pass, so that its lease still holds an older archiver back."""

    READS_PART: ClassVar[bool] = True
    owner: str
    host: str
    pid: Annotated[int, Range(1, MAX_PID)]
    started: float
    renewed: float

    def text(self, now: float) -> str:
        at = utc_iso(datetime.fromtimestamp(self.renewed, timezone.utc))
        return (f"archiver {self.owner} on host {self.host}, pid {self.pid}, last renewed {at} "
                f"({now - self.renewed:.0f}s ago)")


def lease_name(spec: str) -> str:
    return f"{LEASE_FOLDER}/{spec}.json"


def parse_lease(data: bytes) -> LeaseRecord | None:
    """The record, or None when the object is not one (a damaged lease holds nothing back)."""
    try:  # DataMismatch is a ValueError
        record = LeaseRecord.from_json(json.loads(data.decode("utf-8")))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    now = time.time()  # a renewal in 9999 (held forever), before 1970: not a lease
    if stored_time(record.started, now) is None or stored_time(record.renewed, now) is None:
        return None
    return record


def lease_json(record: LeaseRecord) -> bytes:
    return (json.dumps(record.to_json(), indent=2) + "\n").encode()


def _gone(record: LeaseRecord, locked_here: bool) -> bool:
    """A holder of this host whose process no longer runs (locked_here: this process holds the folder's flock, so
    no other process of this host is archiving there)."""
    if record.host != socket.gethostname():
        return False
    return locked_here or not pid_running(record.pid)


class LeaseLost(RefusedError):
    """Another archiver holds the lease now: this one stops without writing more."""


class Lease:
    """The archive lease of spec in store, held from acquire() to release(); a keeper renews it every RENEW_EVERY
    seconds and check() raises (in the caller's thread) once it was lost."""

    def __init__(self, store: Store, spec: str, emit: Emit, locked_here: bool = False) -> None:
        self.store, self.spec, self.emit, self.locked_here = store, spec, emit, locked_here
        self.name = lease_name(spec)
        now = time.time()
        self.mine = LeaseRecord(os.urandom(6).hex(), socket.gethostname(), os.getpid(), now, now)
        self._lost: OpsctlError | None = None
        self._failing_since: float | None = None
        self._done = threading.Event()

    def _read(self) -> LeaseRecord | None:
        data = self.store.get_bytes(self.name)
        return None if data is None else parse_lease(data)

    def _write(self) -> None:
        self.mine = LeaseRecord(self.mine.owner, self.mine.host, self.mine.pid, self.mine.started, time.time())
        self.store.put_bytes(self.name, lease_json(self.mine))

    def acquire(self) -> None:
        """Take the lease: refused while another holder's is fresh, taken over (said) when it is stale."""
        held = self._read()
        now = time.time()
        if held is not None and held.owner != self.mine.owner:
            gone = _gone(held, self.locked_here)
            if now - held.renewed < STALE_AFTER and not gone:
                raise RefusedError(f"another archiver holds {self.store.where(self.name)}", held.text(now), HINT)
            why = "its process is gone" if gone else f"no renewal for more than {STALE_AFTER:.0f}s"
            self.emit(Note(f"taking over the archive lease {self.store.where(self.name)} from {held.text(now)}: "
                           f"{why}"))
        self._write()
        time.sleep(SETTLE)
        after = self._read()
        if after is not None and after.owner != self.mine.owner:
            raise RefusedError(f"another archiver took {self.store.where(self.name)} at the same moment",
                               after.text(time.time()), HINT)

    def renew(self) -> None:
        """Write a new renewal time, or record the loss when another archiver's lease is there now."""
        held = self._read()
        if held is not None and held.owner != self.mine.owner:
            self._lost = LeaseLost(f"this archiver lost {self.store.where(self.name)} to another one",
                                   f"{held.text(time.time())}; this one stops without writing more", HINT)
            self._done.set()
            return
        self._write()

    def keep(self) -> None:
        """The keeper: renew every RENEW_EVERY s until released or lost; a store that fails is said once per
        outage and tried again at the next renewal."""
        while not self._done.wait(RENEW_EVERY):
            try:
                self.renew()
            except OpsctlError as exc:
                if self._failing_since is None:
                    self._failing_since = time.time()
                    self.emit(Note(f"cannot renew the archive lease ({exc.summary}); trying again every "
                                   f"{RENEW_EVERY:.0f}s"))
                continue
            if self._failing_since is not None:
                self.emit(Note(f"the archive lease is renewed again after {time.time() - self._failing_since:.0f}s"))
                self._failing_since = None

    def check(self) -> None:
        """Raise LeaseLost in the caller's thread once the keeper found another owner."""
        if self._lost is not None:
            raise self._lost

    def release(self) -> None:
        """Stop renewing; the lease object goes when it is still this archiver's."""
        self._done.set()
        if self._lost is not None:
            return
        try:
            held = self._read()
            if held is not None and held.owner == self.mine.owner:
                self.store.delete([self.name])
        except Stopped:
            raise  # a second signal: at once
        except OpsctlError:
            pass  # a lease left behind goes stale


@contextmanager
def archive_lease(store: Store, spec: str, emit: Emit) -> Iterator[Lease]:
    """The lease of spec's archive in store for the block, renewed in the background; released after."""
    with ExitStack() as stack:
        local = isinstance(store, FolderStore)
        if isinstance(store, FolderStore):
            stack.enter_context(_folder_lock(store, spec))
        lease = Lease(store, spec, emit, locked_here=local)
        lease.acquire()
        with Borrowed() as pool:
            keeper = pool.submit(lease.keep)
            try:
                yield lease
            finally:
                lease.release()
                keeper.result()


@contextmanager
def _folder_lock(store: FolderStore, spec: str) -> Iterator[None]:
    """The folder's flock for spec's archive: refused naming the lease's holder while another process has it."""
    folder = store.root / LEASE_FOLDER / spec
    make_dir(folder.parent, 0o700, trusted_owners(), enforce=False)
    with ExitStack() as stack:
        try:
            stack.enter_context(state_lock(folder))
        except FileProblem:
            raise
        except OpsctlError as exc:  # held by another process
            data = store.get_bytes(lease_name(spec))
            record = parse_lease(data) if data is not None else None
            detail = record.text(time.time()) if record is not None else exc.summary
            raise RefusedError(f"another archiver holds {store.where(lease_name(spec))}", detail, HINT) from None
        yield
