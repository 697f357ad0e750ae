"""A tampered backup directory (issue 23, item 7a): a file name that climbs out of the folder or is absolute, a
linked RDB or manifest, a manifest over the read limit, a manifest naming a file that is not there, a shard listed
twice. `backup verify DIR` and `restore --from DIR` refuse each with the file and the field, exit 1, and write
nothing to the target. Valkey 9.1, one standalone source and one standalone target."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lifecycle import run
from tests.test_restore_faults import load
from tests.test_restore_live import backup_dir, clients, restore, topologies

Tamper = Callable[[Path], None]


def _edit(change: Callable[[dict], None]) -> Tamper:
    def tamper(folder: Path) -> None:
        data = json.loads((folder / "manifest.json").read_text())
        change(data)
        (folder / "manifest.json").write_text(json.dumps(data))
    return tamper


def _file(name: str) -> Tamper:
    return _edit(lambda d: d["shards"][0].update(file=name))


def _linked_rdb(folder: Path) -> None:
    """The same bytes, sha256 included, kept outside and linked in: only the link itself is wrong."""
    outside = folder.parent / f"{folder.name}-elsewhere.rdb"
    shutil.move(folder / "shard-1.rdb", outside)
    os.symlink(outside, folder / "shard-1.rdb")


def _linked_manifest(folder: Path) -> None:
    outside = folder.parent / f"{folder.name}-manifest.json"
    shutil.move(folder / "manifest.json", outside)
    os.symlink(outside, folder / "manifest.json")


def _huge_manifest(folder: Path) -> None:
    with open(folder / "manifest.json", "r+b") as handle:
        handle.truncate((64 << 20) + 1)  # sparse: over the limit without writing 64 MiB


def _second_shard(folder: Path) -> None:
    """shards[1]: the first shard copied under another number and node, its file a copy of the first one's."""
    shutil.copyfile(folder / "shard-1.rdb", folder / "shard-2.rdb")
    _edit(lambda d: d["shards"].append({**d["shards"][0], "shard": 2, "node": "other", "file": "shard-2.rdb"}))(folder)


def _same_shard_twice(folder: Path) -> None:
    _edit(lambda d: d["shards"].append(d["shards"][0]))(folder)


CASES: dict[str, tuple[Tamper, str]] = {
    "climbs-out": (_file("../../etc/x"), "manifest.json: shards[0].file has an unexpected value '../../etc/x'"),
    "absolute": (_file("/etc/passwd"), "manifest.json: shards[0].file has an unexpected value '/etc/passwd'"),
    "linked-rdb": (_linked_rdb, "shard-1.rdb: is a symbolic link"),
    "linked-manifest": (_linked_manifest, "manifest.json: is a symbolic link"),
    "huge-manifest": (_huge_manifest, "manifest.json: is too big"),
    "missing-file": (lambda folder: (folder / "shard-1.rdb").unlink(), "shard-1.rdb: is missing"),
    "no-manifest": (lambda folder: (folder / "manifest.json").unlink(), "manifest.json: is missing"),
    "shard-twice": (_same_shard_twice, "manifest.json: shards lists a shard twice"),
    "second-shard": (_second_shard, "manifest.json: shards lists 2 shards; a standalone backup holds one"),
}


@pytest.mark.integration
def test_a_tampered_backup_is_refused_before_anything_is_written(tmp_path, capsys) -> None:
    with topologies(tmp_path, capsys, "valkey", ("standalone", {}), ("standalone", {})) as deployed_:
        (source, s_loaded), (target, t_loaded) = deployed_
        load(clients(s_loaded)[0], 500)
        good = backup_dir(capsys, source, tmp_path / "backups")
        code, out, err = run(capsys, "backup", "verify", str(good))
        assert code == 0, err + out
        for name, (tamper, message) in CASES.items():
            folder = tmp_path / "tampered" / name
            shutil.copytree(good, folder)
            tamper(folder)
            for argv in (("backup", "verify", str(folder)), ("restore", "-f", str(target), "--from", str(folder))):
                code, out, err = run(capsys, *argv)
                assert code == 1 and message in err and "Traceback" not in err, (name, argv[0], err + out)
            assert clients(t_loaded)[0].dbsize() == 0, name
        code, out, err = restore(capsys, target, "--from", str(good))  # the untouched backup still restores
        assert code == 0 and clients(t_loaded)[0].dbsize() == 500, err + out


def test_a_file_swapped_for_a_link_after_its_checks_is_never_read(tmp_path) -> None:
    """The checksum and the scratch server's copy open the file itself: a link put there later is refused."""
    from opsctl.backup.integrity import file_problem
    from opsctl.backup.scratch import _place
    from opsctl.state.safefs import FileProblem
    from tests.test_backup_units import manifest, shard

    outside = tmp_path / "elsewhere.rdb"
    outside.write_bytes(b"REDIS0011" + b"x" * 111)
    folder = tmp_path / "backup"
    folder.mkdir()
    os.symlink(outside, folder / "shard-1.rdb")
    entry = manifest(shard(1)).shards[0]
    assert file_problem(folder, entry) == f"{folder / 'shard-1.rdb'}: is a symbolic link"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(FileProblem, match=r"shard-1\.rdb: is not a regular file"):
        _place(folder / "shard-1.rdb", scratch)
