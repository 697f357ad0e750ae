"""`opsctl backup verify DIR`: every file's checksum, then every file loaded into a scratch server and its
keys counted against the manifest."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from opsctl.backup.manifest import MANIFEST, Manifest, ShardFile, count_problem, parse_manifest
from opsctl.backup.plan import pick_scratch
from opsctl.backup.scratch import scratch_binaries, scratch_servers
from opsctl.base.errors import OpsctlError
from opsctl.base.events import ChecksumsOk, Emit, ShardVerified
from opsctl.state.safefs import read_bounded

CHUNK = 1 << 20


def _regular(path: Path, what: str) -> os.stat_result:
    """A regular file, not a symlink; an OpsctlError naming it otherwise."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise OpsctlError(f"{path}: {what} is missing", hint="the backup is incomplete: use another backup") from None
    if not stat.S_ISREG(info.st_mode):
        raise OpsctlError(f"{path}: {what} is not a regular file", hint="a backup holds plain files, never links")
    return info


def read_manifest(folder: Path) -> Manifest:
    if not folder.is_dir():
        raise OpsctlError(f"{folder} is not a directory", hint="pass the backup's directory (it holds manifest.json)")
    path = folder / MANIFEST
    _regular(path, "the manifest")
    text = read_bounded(path, "the backup is damaged: use another backup", limit=64 << 20)
    return parse_manifest(text or "", str(path))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_problem(folder: Path, shard: ShardFile) -> str | None:
    """Why a shard's file cannot be trusted (missing, size or checksum), or None."""
    path = folder / shard.file
    try:
        size = _regular(path, "the RDB file").st_size
    except OpsctlError as exc:
        return exc.summary
    if size != shard.bytes:
        return f"{path}: {size} bytes, the manifest says {shard.bytes}"
    if sha256_of(path) != shard.sha256:
        return f"{path}: sha256 differs from the manifest (the file is corrupt)"
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
