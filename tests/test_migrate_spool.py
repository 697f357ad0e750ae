"""The stream that arrives while the snapshot is copied goes to a spool (opsctl.migrate.spool): its file read back
validated, a command cut off by a kill dropped; live, a source whose backlog holds far less than the copy's writes
is migrated without starting over, and a migrate SIGKILLed during the copy resumes from the spool's end."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from opsctl.base.errors import OpsctlError
from opsctl.migrate.spool import Spool, SpoolWriter
from opsctl.net.rawpipe import PipeClosed
from opsctl.spec.load import LoadedSpec
from opsctl.stream.framing import Entry, Position
from tests.lifecycle import deployed, run
from tests.support import CONDITION_BOUND, bare_server
from tests.test_migrate_foreign import SECRET, password_file
from tests.test_migrate_live import TARGET, Migrate, fill
from tests.writer import Writer, cluster_client

START = Position("a" * 40, 1000)


class FakeStream:
    """Hands over the given batches of entries, then a lost link."""

    def __init__(self, batches: list[list[Entry]]) -> None:
        self.batches, self.acked = list(batches), 0

    def read(self, timeout: float) -> list[Entry]:
        if not self.batches:
            raise PipeClosed("gone")
        return self.batches.pop(0)

    def ack(self, offset: int) -> None:
        self.acked = offset


def _entries(first: int, count: int) -> list[Entry]:
    return [Entry((b"SET", b"k%d" % i, b"v" * i), first + 10 * (i + 1), 1700000000.0 + i) for i in range(count)]


def _spooled(tmp_path: Path, batches: list[list[Entry]]) -> Spool:
    spool = Spool(tmp_path / "s.spool", START)
    writer = SpoolWriter(FakeStream(batches), spool, spool.create())  # type: ignore[arg-type]
    writer.start()
    deadline = time.monotonic() + 5
    while writer.lost is None and time.monotonic() < deadline:  # every batch read, then the link is lost
        time.sleep(0.01)
    assert writer.stop() is False and writer.lost is not None and "PipeClosed" in writer.lost
    return spool


def test_a_spool_reads_back_what_was_written_in_order(tmp_path) -> None:
    written = _entries(START.offset, 5)
    spool = _spooled(tmp_path, [written[:2], [], written[2:]])
    assert (tmp_path / "s.spool").stat().st_mode & 0o777 == 0o600
    assert spool.read() == written and spool.end == written[-1].end
    assert spool.read() == []
    again = Spool(tmp_path / "s.spool", None)  # a resumed run knows the position applied only
    assert again.read() == written and again.start == START


def test_a_command_cut_off_by_a_kill_is_dropped_when_the_spool_is_reopened(tmp_path) -> None:
    written = _entries(START.offset, 3)
    _spooled(tmp_path, [written])
    path = tmp_path / "s.spool"
    whole = path.stat().st_size
    with path.open("ab") as handle:
        handle.write(b"*3\r\n$4\r\n1100\r\n$3\r\n1.0")  # cut off mid-record
    spool = Spool(path, START)
    fd, continue_at = spool.reopen()
    os.close(fd)
    assert continue_at == written[-1].end and path.stat().st_size == whole
    assert spool.read() == written


@pytest.mark.parametrize(("bytes_", "expect"), [
    (b"not resp", "not a spool opsctl wrote"),
    (b"*3\r\n$5\r\nother\r\n$1\r\nx\r\n$1\r\n1\r\n", "not a spool opsctl wrote"),
    (b"*3\r\n$14\r\nopsctl-spool-1\r\n$1\r\nb\r\n$1\r\n5\r\n", "a spool of another snapshot"),
])
def test_a_spool_that_is_not_this_snapshots_is_refused_by_name(tmp_path, bytes_: bytes, expect: str) -> None:
    path = tmp_path / "s.spool"
    path.write_bytes(bytes_)
    with pytest.raises(OpsctlError) as refused:
        Spool(path, START).read()
    assert expect in refused.value.summary and str(path) in refused.value.summary


def test_records_out_of_order_are_refused(tmp_path) -> None:
    spool = _spooled(tmp_path, [_entries(START.offset, 2)])
    with (tmp_path / "s.spool").open("ab") as handle:
        handle.write(b"*4\r\n$4\r\n1005\r\n$3\r\n1.0\r\n$3\r\nDEL\r\n$1\r\nk\r\n")  # before the last one's end
    with pytest.raises(OpsctlError, match="out of order"):
        Spool(spool.path, START).read()


@contextmanager
def foreign(tmp_path: Path, capsys: pytest.CaptureFixture[str], backlog: str, keys: int) \
        -> Iterator[tuple[Callable[[], redis.Redis], tuple[str, ...], Path, LoadedSpec]]:
    """A Redis 7.0 of the test's own with this backlog and keys, the options that name it, and a deployed target."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    secret_file = password_file(tmp_path)
    topology, flavor, sections = TARGET
    conf = [f"requirepass {SECRET}", f"repl-backlog-size {backlog}"]
    with bare_server("redis", tmp_path / "src", conf, SECRET) as client, \
            deployed(tmp_path / "dst", capsys, topology, flavor, **sections) as (t, t_loaded):
        where = client.connection_pool.connection_kwargs

        def source() -> redis.Redis:
            return redis.Redis(host=where["host"], port=where["port"], password=SECRET, decode_responses=True)
        fill(source(), keys)
        yield source, ("--from-endpoints", f"{where['host']}:{where['port']}", "--from-password-file",
                       str(secret_file)), t, t_loaded


def _cut_over(capsys: pytest.CaptureFixture[str], migrate: Migrate, t: Path) -> None:
    code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
    assert code == 0 and "cutover done" in out, out + err
    assert migrate.wait() == 0, migrate.stderr()
    assert migrate.done()["ok"], migrate.done()
    assert not list((t.parent / ".opsctl").rglob("migrate-*.spool")), "the spool outlived its use"


@pytest.mark.integration
def test_a_source_whose_16kb_backlog_the_copy_outlasts_is_migrated_under_a_writer(tmp_path, capsys) -> None:
    """The source's writes during the copy are many times what its backlog holds: the link stays attached and the
    stream goes to the spool, so nothing starts over and every acknowledged write arrives."""
    with foreign(tmp_path, capsys, "16kb", 150_000) as (source, argv, t, t_loaded):
        src = source()
        with Writer(source) as writer:
            writer.wait_for_writes(200)
            before = int(src.info("replication")["master_repl_offset"])
            migrate = Migrate(t, None, *argv)
            migrate.streaming(120)
            grown = int(src.info("replication")["master_repl_offset"]) - before
            _cut_over(capsys, migrate, t)
        assert grown > 4 * 16384, f"the stream grew only {grown} bytes during the copy"
        assert int(src.info("stats")["sync_full"]) == 1
        assert writer.verify(cluster_client(t_loaded)) == []


@pytest.mark.integration
def test_a_migrate_killed_during_the_copy_attaches_again_after_its_spool(tmp_path, capsys) -> None:
    """SIGKILL while keys are copied: the re-run reopens the spool (a command cut off is dropped), continues the
    stream after its last command by partial resync and spools on while it copies again."""
    with foreign(tmp_path, capsys, "1mb", 150_000) as (source, argv, t, t_loaded):
        src = source()
        with Writer(source) as writer:
            writer.wait_for_writes(200)
            migrate = Migrate(t, None, *argv)
            _wait_copying(migrate)
            migrate.proc.send_signal(signal.SIGKILL)
            migrate.wait()
            spool = next((t.parent / ".opsctl").rglob("migrate-*.spool"))
            assert spool.stat().st_size > 0
            partial = int(src.info("stats")["sync_partial_ok"])
            migrate = Migrate(t, None, *argv)
            migrate.streaming(120)
            _cut_over(capsys, migrate, t)
        assert int(src.info("stats")["sync_full"]) == 1, "the re-run took a second full copy"
        assert int(src.info("stats")["sync_partial_ok"]) == partial + 1
        assert writer.verify(cluster_client(t_loaded)) == []


def _wait_copying(migrate: Migrate, timeout: float = CONDITION_BOUND) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lags = [e for e in migrate.events if e.get("event") == "migrate-lag"]
        if lags and any(int(s["copied"]) > 0 for s in lags[-1]["shards"].values()):
            return
        time.sleep(0.02)
    raise AssertionError(f"no key copied after {timeout}s: {migrate.events[-3:]}")


def test_a_spool_that_is_a_link_is_not_followed(tmp_path) -> None:
    (tmp_path / "elsewhere").write_bytes(b"")
    (tmp_path / "s.spool").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OpsctlError, match="cannot be opened"):
        Spool(tmp_path / "s.spool", START).read()
    with pytest.raises(OpsctlError, match="cannot be opened"):
        Spool(tmp_path / "s.spool", START).reopen()
    assert (tmp_path / "elsewhere").read_bytes() == b""
