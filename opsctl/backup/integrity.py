"""`opsctl backup verify DIR`: every file's checksum, then every file loaded into a scratch server and its
keys counted against the manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO, ClassVar

from opsctl.backup.manifest import MANIFEST, Manifest, ShardFile, count_problem, parse_manifest
from opsctl.backup.savers import pick_scratch
from opsctl.backup.scratch import scratch_binaries, scratch_servers
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit, Event
from opsctl.base.frozen import Frozen, frozen
from opsctl.state.safefs import FileProblem, open_regular, read_bounded


@frozen
class ChecksumsOk(Frozen, Event):
    kind: ClassVar[str] = "checksums-ok"
    files: int

    def line(self) -> str:
        return f"checksums of {self.files} files match the manifest"


@frozen
class ShardVerified(Frozen, Event):
    kind: ClassVar[str] = "shard-verified"
    shard: int
    file: str
    keys: int

    def line(self) -> str:
        return f"verified shard {self.shard} ({self.file}): {self.keys} keys"


@frozen
class VerifyDone(Frozen, Event):
    kind: ClassVar[str] = "verify-done"
    ok: bool
    keys: int

    def line(self) -> str:
        return f"verified {self.keys} keys"


CHUNK = 1 << 20
MANIFEST_LIMIT = 64 << 20
DAMAGED = "a backup holds plain files and never links: use another backup, or take a new one"


def read_manifest(folder: Path) -> Manifest:
    if not folder.is_dir():
        raise OpsctlError(f"{folder} is not a directory", hint="pass the backup's directory (it holds manifest.json)")
    path = folder / MANIFEST
    text = read_bounded(path, DAMAGED, limit=MANIFEST_LIMIT)
    if text is None:
        raise FileProblem(path, "is missing: the backup did not finish", DAMAGED)
    return parse_manifest(text, str(path))


def _sha256(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_problem(folder: Path, shard: ShardFile) -> str | None:
    """Why a shard's file cannot be trusted (missing, a link, size or checksum), or None. Size and checksum come
    from the one open file: a file swapped for a link after a check is never read."""
    path = folder / shard.file
    try:
        with open_regular(path, DAMAGED) as (handle, size):
            if size != shard.bytes:
                return f"{path}: {size} bytes, the manifest says {shard.bytes}"
            if _sha256(handle) != shard.sha256:
                return f"{path}: sha256 differs from the manifest (the file is corrupt)"
    except FileProblem as exc:
        return exc.summary
    return None


def check_files(folder: Path, manifest: Manifest) -> None:
    """Every file present with its size and checksum: an OpsctlError naming every bad file otherwise."""
    problems = [p for shard in manifest.shards if (p := file_problem(folder, shard))]
    if problems:
        raise OpsctlError(f"{folder}: {len(problems)} damaged file(s) in the backup", "\n".join(problems),
                          "use another backup (nothing was changed)")


def verify_backup(folder: Path, emit: Emit) -> Manifest:
    """Checksums, then loads and counts. Raises OpsctlError naming the first bad file."""
    manifest = read_manifest(folder)
    check_files(folder, manifest)
    emit(ChecksumsOk(len(manifest.shards)))
    binaries = scratch_binaries()
    binary = binaries[pick_scratch(list(binaries), manifest.rdb_version, None, str(folder))]
    databases = max(manifest.dbs() | {0}) + 1
    with scratch_servers(binary, [folder / s.file for s in manifest.shards], databases) as servers:
        spaces = [scratch.keyspace() for scratch in servers]
    for shard, space in zip(manifest.shards, spaces, strict=True):
        path = folder / shard.file
        loaded = {db: keys for db, (keys, _) in space.items()}
        problem = count_problem(shard, loaded)
        if problem:
            raise OpsctlError(f"{path}: {problem}",
                              hint="the file does not hold what was backed up: use another backup")
        emit(ShardVerified(shard.shard, shard.file, sum(loaded.values())))
    return manifest
