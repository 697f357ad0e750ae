"""One archiver per topology and location (issue 27): the archive lease, on the local S3 server and in a folder.

A second `backup --continuous` on the same location refuses (exit 3) naming the holder (host, pid, last renewal)
while the first runs; a lease left by a process of this host that is gone is taken over at once, a lease of
another host only once stale (said); a holder that finds another owner in its lease stops (exit 3). A Valkey 9.1
replication topology (a master and two replicas)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.backup.lease import STALE_AFTER, LeaseRecord, lease_json, lease_name, parse_lease
from opsctl.backup.offsite import open_store
from opsctl.backup.store import Store, parse_location
from tests.s3server import S3Server, s3_prefix_fixture, s3_server_fixture  # noqa: F401 (fixtures)
from tests.support import CONDITION_BOUND
from tests.test_archive_live import Archiver
from tests.test_restore_live import clients, topologies

pytestmark = pytest.mark.integration


def _lease(store: Store, spec: str) -> LeaseRecord:
    data = store.get_bytes(lease_name(spec))
    assert data is not None
    record = parse_lease(data)
    assert record is not None
    return record


def _refused(archiver: Archiver) -> str:
    try:
        code = archiver.proc.wait(CONDITION_BOUND)
    except subprocess.TimeoutExpired:
        archiver.proc.kill()
        raise AssertionError(archiver.log.with_suffix(".err").read_text()[-2000:]) from None
    err = archiver.log.with_suffix(".err").read_text()
    assert code == 3, (code, err)
    return err


def _archiving(archiver: Archiver, client) -> None:
    """Until the archiver stored its first segment (writes go on meanwhile: one made before its base is in the
    base, not in a segment)."""
    deadline = time.monotonic() + CONDITION_BOUND
    while not any(e["event"] == "segment-archived" for e in archiver.events()):
        assert archiver.proc.poll() is None, archiver.log.with_suffix(".err").read_text()
        assert time.monotonic() < deadline, archiver.log.read_text()[-2000:]
        client.incr("writes")
        time.sleep(0.2)


def _notes(archiver: Archiver) -> list[str]:
    return [e["text"] for e in archiver.events() if e["event"] == "note"]


@contextmanager
def _renewed(store: Store, spec: str, record: LeaseRecord) -> Iterator[None]:
    """record's lease renewed every second meanwhile, as its live archiver on another host would: written once, a
    loaded machine (two CPU hogs) started the next archiver after STALE_AFTER and it took the lease over."""
    done = threading.Event()

    def renew() -> None:
        while True:
            store.put_bytes(lease_name(spec), lease_json(replace(record, renewed=time.time())))
            if done.wait(1.0):
                return

    keeper = threading.Thread(target=renew, daemon=True)
    keeper.start()
    try:
        yield
    finally:
        done.set()
        keeper.join(30)


def _second_archiver_and_takeovers(tmp_path: Path, spec: Path, loaded, url: str) -> None:
    name = loaded.spec.name
    store = open_store(parse_location(url))
    client = clients(loaded)[0]
    first = Archiver(spec, url, tmp_path / "a1.jsonl")
    _archiving(first, client)
    held = _lease(store, name)
    assert held.pid == first.proc.pid and held.host == socket.gethostname()

    err = _refused(Archiver(spec, url, tmp_path / "a2.jsonl"))
    assert "another archiver holds" in err and f"pid {first.proc.pid}" in err and "last renewed" in err, err
    assert _lease(store, name).owner == held.owner  # the refused one wrote nothing

    assert first.kill() == -signal.SIGKILL  # its lease stays, its process is gone: taken over at once
    third = Archiver(spec, url, tmp_path / "a3.jsonl")
    _archiving(third, client)
    assert any("taking over the archive lease" in n and "its process is gone" in n for n in _notes(third))
    assert third.kill() == -signal.SIGKILL

    now = time.time()  # another host's lease, kept renewed: refused; the same, stale: taken over, said
    with _renewed(store, name, LeaseRecord("elsewhere1", "other-host", 4242, now - 60, now)):
        err = _refused(Archiver(spec, url, tmp_path / "a4.jsonl"))
    assert "other-host" in err and "pid 4242" in err, err
    stale = now - STALE_AFTER - 5
    store.put_bytes(lease_name(name), lease_json(LeaseRecord("elsewhere2", "other-host", 4242, now - 60, stale)))
    fifth = Archiver(spec, url, tmp_path / "a5.jsonl")
    _archiving(fifth, client)
    assert any("taking over" in n and "other-host" in n and "no renewal for more than" in n
               for n in _notes(fifth)), _notes(fifth)

    # another archiver's lease written over this one's: it stops at its next renewal, writing nothing more
    store.put_bytes(lease_name(name), lease_json(LeaseRecord("elsewhere3", "other-host", 4343, now, time.time())))
    err = _refused(fifth)
    assert "lost" in err and "other-host" in err, err
    assert _lease(store, name).owner == "elsewhere3"


def test_one_archiver_per_location_on_s3(tmp_path, capsys, s3_server: S3Server, s3_prefix) -> None:
    with topologies(tmp_path, capsys, "valkey", ("replication", {})) as [(spec, loaded)]:
        _second_archiver_and_takeovers(tmp_path, spec, loaded, s3_prefix)


def test_one_archiver_per_location_in_a_folder(tmp_path, capsys) -> None:
    """In a folder the holder's flock refuses a second archiver of this host even before the lease is read."""
    with topologies(tmp_path, capsys, "valkey", ("replication", {})) as [(spec, loaded)]:
        folder = tmp_path / "archive"
        _second_archiver_and_takeovers(tmp_path, spec, loaded, str(folder))
        assert json.loads((folder / lease_name(loaded.spec.name)).read_text())["owner"] == "elsewhere3"
