"""opsctl backup and backup verify against real clusters: under a writer, damaged files, no master forked."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from opsctl.backup.manifest import MANIFEST, parse_manifest
from opsctl.observe.replies import parse_info
from tests.lifecycle import deployed, run
from tests.support import admin_for
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration


def forks(loaded, role: str) -> dict[str, int]:
    out = {}
    for node in loaded.layout.servers:
        if node.role == role:
            with admin_for(loaded, node) as admin:
                out[node.name] = int(parse_info(admin.info("stats"))["total_forks"])
    return out


def backup(capsys, spec: Path, to: Path) -> tuple[Path, dict]:
    code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(to), "--output", "json")
    assert code == 0, err + out
    events = [json.loads(line) for line in out.splitlines()]
    folder = Path(events[-1]["dir"])
    return folder, json.loads((folder / MANIFEST).read_text())


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_cluster_backup_under_writer_holds_every_acked_key(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        preload(loaded, 3000)
        masters_before = forks(loaded, "master")
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(200)
            acked_before = dict(writer.acked)
            folder, _data = backup(capsys, spec, tmp_path / "backups")
            writer.wait_for_writes(len(writer.acked) + 50)
        assert forks(loaded, "master") == masters_before  # the replicas saved
        manifest = parse_manifest((folder / MANIFEST).read_text(), "m")
        assert [s.role for s in manifest.shards] == ["replica"] * 3
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert all(stat.S_IMODE(os.stat(folder / f).st_mode) == 0o600 for f in os.listdir(folder))
        assert "test-pw" not in (folder / MANIFEST).read_text()
        assert sum(s.slots[-1][1] - s.slots[0][0] + 1 for s in manifest.shards) == 16384
        assert manifest.total_keys >= 3000 + len(acked_before)

        code, out, err = run(capsys, "backup", "verify", str(folder))
        assert code == 0 and "ok" in out, err + out
        refused_while_a_slot_moves(capsys, spec, loaded, tmp_path)
        restored = keys_in_backup(folder, flavor)
        missing = [k for k in acked_before if k.encode() not in restored]
        assert missing == []

        broken = folder / manifest.shards[1].file
        raw = bytearray(broken.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        broken.write_bytes(bytes(raw))
        code, out, err = run(capsys, "backup", "verify", str(folder))
        assert code == 1 and manifest.shards[1].file in err and "sha256" in err, err


def keys_in_backup(folder: Path, flavor: str) -> set[bytes]:
    from opsctl.backup.integrity import read_manifest
    from opsctl.backup.scratch import scratch_binaries, scratch_server
    from tests.support import unix_client

    manifest = read_manifest(folder)
    binaries = scratch_binaries()
    binary = binaries[("valkey", (9, 1))]
    keys: set[bytes] = set()
    for shard in manifest.shards:
        with scratch_server(binary, folder / shard.file, shard.file) as scratch:
            keys.update(unix_client(scratch.socket).scan_iter(count=1000))
    return keys


def refused_while_a_slot_moves(capsys, spec: Path, loaded, tmp_path: Path) -> None:
    masters = [n for n in loaded.layout.servers if n.role == "master"]
    with admin_for(loaded, masters[0]) as first, admin_for(loaded, masters[1]) as second:
        first.call("CLUSTER", "SETSLOT", 7, "MIGRATING", second.call("CLUSTER", "MYID"))
        try:
            code, _, err = run(capsys, "backup", "-f", str(spec), "--to", str(tmp_path / "refused"))
        finally:
            first.call("CLUSTER", "SETSLOT", 7, "STABLE")
    assert code == 3 and "slots in motion" in err and "slot 7 is open" in err, err
    assert not (tmp_path / "refused").exists()


def test_a_to_folder_that_cannot_be_made_is_named(tmp_path, capsys) -> None:
    """--to pointing at a file (or below one): the path and a hint, exit 1, no internal error, no fork."""
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded):
        taken = tmp_path / "taken"
        taken.write_text("not a folder")
        before = forks(loaded, "master")
        for to in (taken, taken / "backups"):
            code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(to))
            assert code == 1 and f"{taken}" in err and "--to" in err and "internal error" not in err, err + out
        assert forks(loaded, "master") == before and taken.read_text() == "not a folder"
        if os.geteuid() == 0:  # a --to folder another user controls (they could swap the backup): refused too
            shared = tmp_path / "shared"
            shared.mkdir(mode=0o777)
            os.chown(shared, 65534, 65534)
            code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(shared))
            assert code == 1 and "is owned by" in err and not list(shared.iterdir()), err + out
            assert forks(loaded, "master") == before


def test_a_save_that_began_before_the_backup_is_not_taken_for_its_own(tmp_path, capsys) -> None:
    """A slow save already running on the replicas began before the backup's catch-up: the backup must wait
    for its own save, or the keys written since would be missing from the file it copies."""
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        master = next(n for n in loaded.layout.servers if n.role == "master")
        replicas = [n for n in loaded.layout.servers if n.role == "replica"]
        with admin_for(loaded, master) as admin:
            pipe = admin.client.pipeline(transaction=False)
            for i in range(300):
                pipe.set(f"old:{i}", "x")
            pipe.execute()
            admin.call("WAIT", len(replicas), 5000)
        for node in replicas:  # ~3 s saves, forked before the new keys exist
            with admin_for(loaded, node) as admin:
                admin.config_set("rdb-key-save-delay", "10000")
                admin.call("BGSAVE")
                admin.config_set("rdb-key-save-delay", "0")
        with admin_for(loaded, master) as admin:
            for i in range(20):
                admin.call("SET", f"new:{i}", "y")
        folder, _data = backup(capsys, spec, tmp_path / "backups")
        keys = keys_in_backup(folder, "valkey")
        assert {f"new:{i}".encode() for i in range(20)} <= keys


def test_the_copy_comes_from_the_replicas_fork_at_its_exact_offset(tmp_path, capsys) -> None:
    """Under a writer, each shard's copy is sent by its replica straight from its fork (nothing written to the
    node's own disk: a BGSAVE rewrote dump.rdb), and the manifest's offset is the point the file holds (its
    repl-offset aux field), not an offset read before the save."""
    from opsctl.backup.rdb import repl_position

    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        preload(loaded, 2000)
        replicas = [n for n in loaded.layout.servers if n.role == "replica"]
        dumps = {}
        for node in replicas:
            with admin_for(loaded, node) as admin:
                config = admin.config_get("dir")
            dumps[node.name] = Path(config["dir"]) / "dump.rdb"
        before = {name: path.stat().st_mtime_ns if path.exists() else None for name, path in dumps.items()}
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(200)
            folder, _data = backup(capsys, spec, tmp_path / "backups")
            writer.wait_for_writes(len(writer.acked) + 50)
        after = {name: path.stat().st_mtime_ns if path.exists() else None for name, path in dumps.items()}
        assert after == before
        manifest = parse_manifest((folder / MANIFEST).read_text(), "m")
        for shard in manifest.shards:
            position = repl_position((folder / shard.file).read_bytes()[: 1 << 20])
            assert position is not None and position[1] == shard.repl_offset, (shard.file, position, shard.repl_offset)
