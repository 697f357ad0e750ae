"""A backup's copy says how far it got while it arrives (shard-copying: a bar on a terminal, a heartbeat line off
one), and the RDB version the copy really has, as docs/backup.md states it: Valkey 9.1 sends RDB 11 over the
replication link (its own SAVE writes 80), Redis 7.0 RDB 10 (issue 33 item 8). One standalone server per flavor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

import opsctl.backup.save as save
from tests.lifecycle import deployed, run
from tests.support import PASSWORD

pytestmark = pytest.mark.integration

COPY_VERSION = {"valkey": ("REDIS0011", 11), "redis": ("REDIS0010", 10)}


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_the_copy_says_its_progress_and_its_rdb_version(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, flavor: str) -> None:
    with deployed(tmp_path, capsys, "standalone", flavor, hosts=1) as (spec, loaded):
        node = loaded.layout.nodes[0]
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD)
        pipe = client.pipeline(transaction=False)
        for i in range(20_000):
            pipe.set(f"k{i}", "v" * 100)
        pipe.execute()
        monkeypatch.setattr(save, "COPY_PROGRESS_EVERY", 0.0)  # every chunk: a copy this small takes no second
        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(tmp_path / "b"), "--output", "json")
        assert code == 0, err
        events = [json.loads(line) for line in out.splitlines()]
        copying = [e for e in events if e["event"] == "shard-copying"]
        assert copying and all(e["shard"] == 1 and e["node"] == node.name for e in copying), events[:5]
        assert [e["bytes"] for e in copying] == sorted(e["bytes"] for e in copying) and copying[-1]["estimate"] > 0
        done = events[-1]
        assert done["event"] == "backup-done" and done["format_version"] == 1
        folder = Path(done["dir"])
        magic, version = COPY_VERSION[flavor]
        assert (folder / "shard-1.rdb").read_bytes()[:9] == magic.encode()
        assert json.loads((folder / "manifest.json").read_text())["rdb_version"] == version
