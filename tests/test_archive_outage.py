"""The store failing under a running archive (issue 27): the local S3 server behind a TCP proxy that is switched off
for 8 s (connections refused and cut) while a client writes. The archiver reports the outage, tries the store again
with backoff and goes on once it answers: every acknowledged write is in exactly one stored segment, each shard's
segments chain without a hole or an overlap. A second outage while the master writes more than its backlog holds:
the archiver reports the gap and takes a new base. Valkey 9.1 replication topology (a master, two replicas)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlparse

import pytest

from opsctl.backup.offsite import open_store
from opsctl.backup.segment import chain, decode_segment, parse_name
from opsctl.backup.store import parse_location
from opsctl.backup.timeline import read_bases
from opsctl.base.errors import OpsctlError
from opsctl.base.poll import Pending, wait_for
from tests.s3server import S3Server, s3_prefix_fixture, s3_server_fixture  # noqa: F401 (fixtures)
from tests.support import CONDITION_BOUND, admin_for, free_base_port
from tests.test_archive_live import Archiver
from tests.test_restore_live import clients, topologies

pytestmark = pytest.mark.integration

OUTAGE = 8.0


class Proxy:
    """127.0.0.1:port forwarding to the S3 server; down() refuses new connections and cuts the open ones."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_base_port(["127.0.0.1"], 1, bus=False)
        self.conns: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        assert self.listener is not None
        with suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept(): a close alone leaves it listening
        self.listener.close()
        self.listener = None
        for conn in self.conns:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@contextmanager
def writing(client) -> Iterator[list[int]]:
    """SET w:<i> i, about 50 a second, each acknowledged i recorded, until the block ends."""
    acked: list[int] = []
    done = threading.Event()

    def run() -> None:
        i = 0
        while not done.is_set():
            with suppress(Exception):
                client.set(f"w:{i}", i)
                acked.append(i)
            i += 1
            time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield acked
    finally:
        done.set()
        thread.join()


def stored_writes(url: str, base: str) -> list[int]:
    """Every `SET w:<i>` in the base's stored segments, in order; the segments checked to chain (chain raises on a
    hole or an overlap)."""
    store = open_store(parse_location(url))
    out: list[int] = []
    names = [n for o in store.names(f"{base}/stream/") if (n := parse_name(o))]
    if not names:
        return out
    start = min(n.start for n in names)
    for name in chain(start, names, url):
        prefix = next(o for o in store.names(f"{base}/stream/") if o.endswith(name.text))
        _, entries = decode_segment(name, store.get_bytes(prefix) or b"", prefix)
        out += [int(e.args[2]) for e in entries if e.args[0].upper() == b"SET" and e.args[1].startswith(b"w:")]
    return out


def _notes(archiver: Archiver) -> list[str]:
    return [e["text"] for e in archiver.events() if e["event"] == "note"]


def _wait_note(archiver: Archiver, words: str, timeout: float = CONDITION_BOUND) -> None:
    deadline = time.monotonic() + timeout
    while not any(words in n for n in _notes(archiver)):
        assert archiver.proc.poll() is None, archiver.log.with_suffix(".err").read_text()
        assert time.monotonic() < deadline, (words, _notes(archiver))
        time.sleep(0.2)


def test_an_outage_of_the_store_is_ridden_out_and_a_long_one_starts_a_new_base(tmp_path, capsys,
                                                                              s3_server: S3Server,
                                                                              s3_prefix) -> None:
    endpoint = urlparse(s3_server.endpoint)
    proxy = Proxy((endpoint.hostname or "127.0.0.1", endpoint.port or 80))
    with topologies(tmp_path, capsys, "valkey", ("replication", {})) as [(spec, loaded)]:
        client = clients(loaded)[0]
        saved = dict(os.environ)
        # through the proxy; boto3 gives up on a refused connection after one retry (its own default retries
        # for up to ~15 s, which could outlast the outage)
        os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}", "AWS_MAX_ATTEMPTS": "2"})
        try:
            archiver = Archiver(spec, s3_prefix, tmp_path / "a.jsonl", ["--segment-seconds", "0.2"])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        with writing(client) as acked:
            archiver.wait_segments(3, shards=1)
            proxy.down()
            time.sleep(OUTAGE)  # the outage's length is the fault: a sleep
            proxy.up()
            _wait_note(archiver, "the store answers again")
            archiver.wait_segments(3, shards=1, after=time.time() + 1)
        notes = _notes(archiver)
        assert any("the store failed" in n for n in notes) and not any("gap:" in n for n in notes), notes
        base = read_bases(open_store(parse_location(s3_prefix)))[0].name
        client.set("flush", 1)  # the stream moves on past the last acknowledged write: its segment closes

        def missing_writes() -> list[int]:
            """Acknowledged writes not (yet) in a stored segment: the last ones may be in the segment still open."""
            stored = stored_writes(s3_prefix, base)
            assert len(stored) == len(set(stored)), "a write stored twice"
            first = min(stored)  # writes before the base's copy are in the base, not in a segment
            return [i for i in acked if i > first and i not in set(stored)]

        with suppress(OpsctlError):
            wait_for(lambda: missing_writes() == [] or Pending("the last segment is not stored yet"), CONDITION_BOUND,
                     "every acknowledged write in a stored segment", 0.2)
        missing = missing_writes()
        assert missing == [], missing[:20]

        master = next(n for n in loaded.layout.servers if n.role == "master")
        with admin_for(loaded, master) as admin:
            admin.config_set("repl-backlog-size", "16384")
        failed = sum("the store failed" in n for n in _notes(archiver))
        proxy.down()
        wait_for(lambda: sum("the store failed" in n for n in _notes(archiver)) > failed or None, CONDITION_BOUND,
                 "the archiver to see the store fail (its streams closed)", 0.2)
        for i in range(300):
            client.set(f"bulk:{i}", "x" * 10_000)  # 3 MB: far past the backlog
        time.sleep(OUTAGE)  # the outage's length is the fault: a sleep
        proxy.up()
        _wait_note(archiver, "gap:")
        deadline = time.monotonic() + 90
        while sum(n.startswith("base ") for n in _notes(archiver)) < 2:
            assert time.monotonic() < deadline and archiver.proc.poll() is None, _notes(archiver)
            time.sleep(0.2)
        assert archiver.kill(signal.SIGTERM) == 0
        notes = _notes(archiver)
        assert any("gap:" in n and "new base" in n for n in notes), notes
        assert len(read_bases(open_store(parse_location(s3_prefix)))) == 2
