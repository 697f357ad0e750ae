"""Backups and the continuous archive of a fleet that speaks TLS only, with ACL users (default user off): Redis 7.0,
a master and two replicas, generated certificates. The backup's copies come over TLS from a replica (verified);
the archive's streams are read over TLS as opsctl's ACL user; every write acknowledged while it ran is in exactly
one stored segment; SIGTERM stops it (exit 143); no password in any output or object."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import redis

from opsctl.backup.offsite import open_store
from opsctl.backup.store import parse_location
from opsctl.backup.timeline import read_bases
from opsctl.base.poll import wait_for
from opsctl.state.localdirs import state_dir_for
from tests.lifecycle import run
from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV, tls_client_options
from tests.test_archive_live import Archiver
from tests.test_archive_outage import stored_writes, writing
from tests.test_restore_live import topologies

pytestmark = pytest.mark.integration

SECURE = {"auth": {"mode": "acl", "password": {"env": PASSWORD_ENV}}, "tls": {"enabled": True, "generate": True}}


def test_backup_and_archive_over_tls_as_an_acl_user(tmp_path, capsys) -> None:
    with topologies(tmp_path, capsys, "redis", ("replication", SECURE)) as [(spec, loaded)]:
        master = next(n for n in loaded.layout.servers if n.role == "master")
        client = redis.Redis(host=master.address, port=master.port, username=loaded.spec.auth.admin_user,
                             password=PASSWORD, **tls_client_options(state_dir_for(loaded, None)))
        for i in range(500):
            client.set(f"pre:{i}", i)
        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(tmp_path / "backups"), "--output", "json")
        assert code == 0, err + out
        events = [json.loads(line) for line in out.splitlines()]
        assert [e["role"] for e in events if e["event"] == "shard-saved"] == ["replica"]
        code, out, err = run(capsys, "backup", "verify", events[-1]["dir"])
        assert code == 0 and "500 keys" in out, err + out

        folder = tmp_path / "archive"
        archiver = Archiver(spec, str(folder), tmp_path / "a.jsonl", ["--segment-seconds", "0.2"])
        with writing(client) as acked:
            archiver.wait_segments(3, shards=1)
            began, written = time.time(), len(acked)
            wait_for(lambda: len(acked) >= written + 20 or None, CONDITION_BOUND, "writes under the archiver")
            archiver.wait_segments(3, shards=1, after=began)  # streamed and stored while the writes go on
        archiver.wait_segments(1, shards=1, after=time.time() + 0.5)
        assert archiver.kill(signal.SIGTERM) == 0
        base = read_bases(open_store(parse_location(str(folder))))[0].name
        stored = stored_writes(str(folder), base)
        assert len(stored) == len(set(stored)) and stored, stored[:20]
        assert [i for i in acked if i > min(stored) and i not in set(stored)] == []
        text = archiver.log.read_text() + archiver.log.with_suffix(".err").read_text() + out + err
        objects = b"".join(p.read_bytes() for p in Path(folder).rglob("*") if p.is_file() and p.suffix != ".rdb")
        assert PASSWORD not in text and PASSWORD.encode() not in objects
