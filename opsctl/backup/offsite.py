"""A backup copied to a store (RDBs first, manifest last: no manifest, an unfinished backup) and back (each file's
size and sha256 checked against the manifest before anything reads it). A remote backup is staged in the state dir
first: the manifest's key counts read the files."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

from opsctl.backup.integrity import MANIFEST_LIMIT, check_files
from opsctl.backup.manifest import MANIFEST, Manifest, parse_manifest
from opsctl.backup.save import BackupDone, BackupOptions, run_backup
from opsctl.backup.store import FolderStore, Location, Store, parse_location
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit, Event
from opsctl.base.stop import Stopped
from opsctl.net.connector import Connector

STAGING = "backup-staging"


def staging_dir(state_dir: Path) -> Path:
    """`<state dir>/backup-staging/`, emptied: under the topology lock nothing else stages there, so what a killed
    run left is stale."""
    folder = state_dir / STAGING
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700, parents=True)
    return folder


def _followed_once(location: Location) -> Location:
    """A folder the command line names, to read: a link to it is followed once, here (every later read goes to the
    folder it named then, not through a link that may change under the run). Written folders are never links."""
    assert location.folder is not None
    return replace(location, folder=Path(os.path.realpath(location.folder)))


def open_store(location: Location, probe: str = "") -> Store:
    """The store of a location; an s3 one needs boto3 (the `s3` extra), named when missing. probe "write": the
    location takes writes (a missing bucket, denied access, a wrong region, an unreachable endpoint, a folder that
    is a file: said before any work); "read": it exists and holds something (never read as an empty one)."""
    store: Store
    if location.folder is not None:
        store = FolderStore(location if probe == "write" else _followed_once(location))
    else:
        from opsctl.backup.s3 import S3Store

        store = S3Store(location)
    if probe:
        store.probe(writing=probe == "write")
    return store


def upload_backup(store: Store, folder: Path, manifest: Manifest) -> str:
    """The backup's files as `<folder name>/<file>` objects, the manifest last; the backup's URL. An upload that
    fails removes what it stored (best effort; without its manifest it never reads as a backup anyway)."""
    stored: list[str] = []
    try:
        for name in [*(shard.file for shard in manifest.shards), MANIFEST]:
            stored.append(f"{folder.name}/{name}")
            store.put_file(stored[-1], folder / name)
    except BaseException:
        with suppress(OpsctlError, OSError):  # the upload's failure is the error; what a failed delete leaves has
            store.delete(stored)  # no manifest: never read as a backup, and `backup prune` removes it
        raise
    return store.where(folder.name)


@contextmanager
def staged_backup(connector: Connector, store: Store, state_dir: Path, emit: Emit,
                  options: BackupOptions) -> Iterator[tuple[Path, Manifest]]:
    """A backup into the store, its files on disk for the block: a folder store's own, or a staged copy uploaded
    before the block and removed after it whatever happens. The backup-done event (a command's result) is held
    back until the upload finished, and names the URL."""
    if isinstance(store, FolderStore):
        yield run_backup(connector, store.root, emit, options)
        return
    staging = staging_dir(state_dir)
    done: list[BackupDone] = []

    def held(event: Event) -> None:
        if isinstance(event, BackupDone):
            done.append(event)
        else:
            emit(event)

    try:
        folder, manifest = run_backup(connector, staging, held, options)
        where = upload_backup(store, folder, manifest)
        emit(replace(done[0], dir=where))
        yield folder, manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def read_remote_manifest(store: Store, name: str) -> tuple[Manifest, bytes]:
    """The manifest of backup `name` and its bytes as read (one read: the copy kept is the one checked)."""
    data = store.get_bytes(f"{name}/{MANIFEST}", MANIFEST_LIMIT)
    if data is None and not store.names(f"{name}/"):  # nothing there at all: not an unfinished backup either
        raise OpsctlError(f"no backup at {store.where(name)}: the store holds nothing under this name",
                          hint="`opsctl backup list --from URL` lists the complete backups")
    if data is None:
        raise OpsctlError(f"{store.where(name)} holds no {MANIFEST}: not a backup, or one that did not finish",
                          hint="`opsctl backup list --from URL` lists the complete backups")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise OpsctlError(f"{store.where(name + '/' + MANIFEST)} is not UTF-8 text",
                          hint="the backup is damaged: use another backup") from None
    return parse_manifest(text, store.where(f"{name}/{MANIFEST}")), data


def download_backup(store: Store, name: str, into: Path) -> Path:
    """The backup `name` as a folder under `into` (a private folder), every file checked against its manifest."""
    manifest, data = read_remote_manifest(store, name)
    folder = into / Path(name).name
    folder.mkdir(mode=0o700)
    for shard in manifest.shards:
        store.get_file(f"{name}/{shard.file}", folder / shard.file)
        (folder / shard.file).chmod(0o600)
    (folder / MANIFEST).write_bytes(data)
    try:
        check_files(folder, manifest)
    except Stopped:
        raise  # a stop request keeps its own words
    except OpsctlError as exc:  # name the objects, not the private copies
        raise OpsctlError(exc.summary.replace(str(folder), store.where(name)),
                          exc.detail.replace(str(folder), store.where(name)), exc.hint) from None
    return folder


@contextmanager
def fetched(source: str, work: Path | None) -> Iterator[tuple[Path, str]]:
    """(a backup folder, where it came from): the folder itself, or an s3:// backup downloaded (every file checked
    against its manifest) into a private temp folder under work (the system's temp dir when None), removed after.
    Downloaded, not streamed: a scratch server loads each RDB from a file, and every checksum is known good first."""
    location = parse_location(source)
    if location.folder is not None:
        yield _followed_once(location).folder or location.folder, ""
        return
    parent, _, name = location.prefix.rpartition("/")
    if not name:
        raise OpsctlError(f"{source} names a bucket, not a backup",
                          hint="give s3://BUCKET/PREFIX/<name>-<UTC time> (`opsctl backup list --from URL`)")
    store = open_store(replace(location, prefix=parent))
    if work is not None:
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".restore-", dir=work) as into:
        yield download_backup(store, name, Path(into)), source
