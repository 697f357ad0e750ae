"""What a backup holds: manifest.json, written last, validated field by field when read back. Pure.

A backup directory is `<name>-<UTC timestamp>/` with one RDB per shard (`shard-<n>.rdb`, 0600) and the
manifest. A directory without a manifest is an unfinished backup and is never restored from.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import DataMismatch, ascii_decimal, read_fields, stored_iso
from opsctl.observe.replies import SLOTS
from opsctl.spec.model import TOPOLOGIES

MANIFEST = "manifest.json"
FORMAT = 1
FLAVORS = ("redis", "valkey")
MAGICS = {b"REDIS": "redis", b"VALKEY": "valkey"}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FILE = re.compile(r"^shard-[0-9]{1,5}\.rdb$")
_VERSION = re.compile(r"^[0-9]{1,3}\.[0-9]{1,3}$")
MAX_DBS = 1 << 16



@dataclass(frozen=True)
class ShardFile:
    """One shard's RDB. keys/expires per db come from loading the file (exact); keys_at_save is what the
    saving node's INFO keyspace said just before its fork (informational under writes)."""

    shard: int
    node: str
    role: str
    slots: tuple[tuple[int, int], ...]
    file: str
    bytes: int
    sha256: str
    keys: dict[int, int]
    expires: dict[int, int]
    keys_at_save: dict[int, int]
    repl_offset: int
    saved_at: str
    dataset_bytes: int

    @property
    def total_keys(self) -> int:
        return sum(self.keys.values())


@dataclass(frozen=True)
class Manifest:
    name: str
    topology: str
    flavor: str
    version: str
    rdb_version: int
    created_at: str
    shards: tuple[ShardFile, ...]
    format: int = FORMAT

    @property
    def total_keys(self) -> int:
        return sum(s.total_keys for s in self.shards)

    @property
    def dataset_bytes(self) -> int:
        return sum(s.dataset_bytes for s in self.shards)

    def dbs(self) -> set[int]:
        return {db for s in self.shards for db, count in s.keys.items() if count}


def utc_stamp(moment: datetime) -> str:
    """`20261122T235959Z`: sortable, no characters a file system or a shell treats specially."""
    return moment.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def utc_iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def shard_file_name(shard: int) -> str:
    return f"shard-{shard}.rdb"


def rdb_header(head: bytes) -> tuple[str, int] | None:
    """(flavor, RDB format version) from a file's first 9 bytes: REDIS0010, VALKEY080. None: not an RDB."""
    for magic, flavor in MAGICS.items():
        digits = head[len(magic):9]
        if head.startswith(magic) and len(digits) == 9 - len(magic) and digits.isdigit():
            return flavor, int(digits)
    return None


def manifest_json(manifest: Manifest) -> str:
    data = asdict(manifest)
    for shard in data["shards"]:
        shard["slots"] = [list(r) for r in shard["slots"]]
        for key in ("keys", "expires", "keys_at_save"):
            shard[key] = {str(db): n for db, n in sorted(shard[key].items())}
    return json.dumps(data, indent=2) + "\n"


# --- reading back --------------------------------------------------------------------------------------------


@frozen
class SavedShardFile(Frozen):
    """A shard's entry as manifest_json writes it (databases as text keys), read by its types (base/record); the
    values' rules are _shard's."""

    shard: int
    node: str
    role: str
    slots: tuple[tuple[int, int], ...]
    file: str
    bytes: int
    sha256: str
    keys: dict[str, int]
    expires: dict[str, int]
    keys_at_save: dict[str, int]
    repl_offset: int
    saved_at: str
    dataset_bytes: int


@frozen
class SavedManifest(Frozen):
    """manifest.json as manifest_json writes it, read by its types (base/record); the values' rules are
    parse_manifest's."""

    name: str
    topology: str
    flavor: str
    version: str
    rdb_version: int
    created_at: str
    shards: tuple[SavedShardFile, ...]
    format: int


class _Rules:
    """The rules of a manifest's values, each problem naming the file and the field (`<file>: <field> <what>`)."""

    def __init__(self, where: str, path: str = "") -> None:
        self.where, self.path = where, path

    def bad(self, field: str, what: str) -> OpsctlError:
        return OpsctlError(f"{self.where}: {field} {what}",
                           hint="the backup is damaged or was edited: use another backup, or take a new one "
                                "(`opsctl backup -f SPEC --to DIR`)")

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def count(self, key: str, value: int, most: int = 1 << 62) -> int:
        if not 0 <= value <= most:
            raise self.bad(self.name(key), f"is {value}, outside 0..{most}")
        return value

    def text(self, key: str, value: str, pattern: re.Pattern[str] | None = None, choices: tuple[str, ...] = ()) -> str:
        if (pattern and not pattern.match(value)) or (choices and value not in choices) or not value:
            allowed = f" (one of {', '.join(choices)})" if choices else ""
            raise self.bad(self.name(key), f"has an unexpected value {value[:80]!r}{allowed}")
        return value

    def time(self, key: str, value: str) -> str:
        """An ISO time with a zone, after 1970 and not in the future (a day of clock skew allowed)."""
        if stored_iso(self.text(key, value), time.time()) is None:
            raise self.bad(self.name(key), f"is not an ISO time from 1970 to now: {value[:40]!r}")
        return value

    def per_db(self, key: str, raw: dict[str, int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for db, count in raw.items():
            if ascii_decimal(db, 0, MAX_DBS - 1) is None:
                raise self.bad(self.name(key), f"has a key {db!r} that is not a database number")
            if count < 0:
                raise self.bad(f"{self.name(key)}.{db}", "must be a count (an integer >= 0)")
            out[int(db)] = count
        return out

    def slots(self, key: str, pairs: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        for i, (start, end) in enumerate(pairs):
            if not 0 <= start <= end < SLOTS:
                raise self.bad(f"{self.name(key)}[{i}]", f"must be [start, end] with 0 <= start <= end <= {SLOTS - 1}")
        return pairs


def _shard(saved: SavedShardFile, where: str, index: int) -> ShardFile:
    f = _Rules(where, f"shards[{index}]")
    shard = ShardFile(
        shard=f.count("shard", saved.shard, 1 << 16), node=f.text("node", saved.node),
        role=f.text("role", saved.role, choices=("master", "replica")), slots=f.slots("slots", saved.slots),
        file=f.text("file", saved.file, _FILE), bytes=f.count("bytes", saved.bytes),
        sha256=f.text("sha256", saved.sha256, _SHA256), keys=f.per_db("keys", saved.keys),
        expires=f.per_db("expires", saved.expires), keys_at_save=f.per_db("keys_at_save", saved.keys_at_save),
        repl_offset=f.count("repl_offset", saved.repl_offset), saved_at=f.time("saved_at", saved.saved_at),
        dataset_bytes=f.count("dataset_bytes", saved.dataset_bytes))
    if shard.file != shard_file_name(shard.shard):
        raise f.bad(f.name("file"), f"is {shard.file!r}, expected {shard_file_name(shard.shard)!r}")
    return shard


# A type's words in base/record's errors -> in the manifest's (`rdb_version must be int, not str`), as before.
_KINDS = {"a string": "str", "a whole number": "int", "a list": "list", "an object": "dict", "true or false": "bool",
          "string": "str", "whole number": "int", "list": "list", "object": "dict", "null": "NoneType",
          "number": "float", "a number": "float"}


def _mismatch(f: _Rules, exc: DataMismatch) -> OpsctlError:
    """base/record's `<field>: <what>` in the manifest's words from before: `<field> <what>`."""
    field, said, what = str(exc).partition(": ")
    if not said:  # the whole file
        field, what = "the manifest", str(exc)
    kinds = re.fullmatch(r"expected (.+), found (.+)", what)
    if kinds and kinds[1] == "an object":
        what = "is not a JSON object"
    elif kinds and kinds[1] in _KINDS and kinds[2] in _KINDS:
        what = f"must be {_KINDS[kinds[1]]}, not {_KINDS[kinds[2]]}"
    elif what.startswith("unknown field"):
        what = f"has an {what}"
    return f.bad(field, what)


def parse_manifest(text: str, where: str) -> Manifest:
    """The manifest in text (from file `where`), or an OpsctlError naming the file and the bad field."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise OpsctlError(f"{where}: nested too deeply to be a manifest",
                          hint="the backup is damaged: use another backup") from None
    except ValueError as exc:
        raise OpsctlError(f"{where}: not valid JSON ({exc})",
                          hint="the backup is damaged: use another backup") from None
    f = _Rules(where)
    written = data.get("format") if isinstance(data, dict) else None
    if type(written) is int and written != FORMAT:  # another format's fields are not this one's: said first
        raise f.bad("format", f"is {written}; this opsctl reads format {FORMAT}")
    if isinstance(data, dict) and type(written) is not int:  # no format: not a manifest at all, said before any field
        raise f.bad("format", "is missing" if "format" not in data else f"must be int, not {type(written).__name__}")
    try:
        saved = read_fields(SavedManifest, data)
    except DataMismatch as exc:
        raise _mismatch(f, exc) from None
    shards = tuple(_shard(item, where, i) for i, item in enumerate(saved.shards))
    manifest = Manifest(name=f.text("name", saved.name),
                        topology=f.text("topology", saved.topology, choices=TOPOLOGIES),
                        flavor=f.text("flavor", saved.flavor, choices=FLAVORS),
                        version=f.text("version", saved.version, _VERSION),
                        rdb_version=f.count("rdb_version", saved.rdb_version, 255),
                        created_at=f.time("created_at", saved.created_at), shards=shards)
    _check_shards(f, manifest.topology, manifest.shards)
    return manifest


def _check_shards(f: _Rules, topology: str, shards: tuple[ShardFile, ...]) -> None:
    """A shard once: one file per shard number, node, content and slot; one shard outside a cluster."""
    if not shards:
        raise f.bad("shards", "is empty")
    numbers = [s.shard for s in shards]
    if len(set(numbers)) != len(numbers):
        raise f.bad("shards", f"lists a shard twice: {sorted(numbers)}")
    if topology != "cluster" and len(shards) > 1:
        raise f.bad("shards", f"lists {len(shards)} shards; a {topology} backup holds one")
    for i, shard in enumerate(shards):
        for db, count in shard.expires.items():
            if count > shard.keys.get(db, 0):
                raise f.bad(f"shards[{i}].expires.{db}", "is larger than the key count")
        for j, other in enumerate(shards[:i]):
            _refuse_twice(f, (i, shard), (j, other))


def _refuse_twice(f: _Rules, one: tuple[int, ShardFile], earlier: tuple[int, ShardFile]) -> None:
    """A shard whose node, file content or slots an earlier one has already: a copied entry or file."""
    (i, shard), (j, other) = one, earlier
    if shard.node == other.node:
        raise f.bad(f"shards[{i}].node", f"names the node of shards[{j}] ({shard.node!r}): one file per node")
    if shard.sha256 == other.sha256:
        raise f.bad(f"shards[{i}].sha256", f"is the file of shards[{j}]: a shard's file copied")
    for start, end in shard.slots:
        if any(start <= b and a <= end for a, b in other.slots):
            raise f.bad(f"shards[{i}].slots", f"overlap those of shards[{j}]: a slot belongs to one shard")


def describe(manifest: Manifest) -> str:
    """One line: `orders (cluster, valkey 9.1, RDB 11): 3 shards, 120000 keys`."""
    return (f"{manifest.name} ({manifest.topology}, {manifest.flavor} {manifest.version}, RDB {manifest.rdb_version}): "
            f"{len(manifest.shards)} shard(s), {manifest.total_keys} keys")


def count_problem(shard: ShardFile, loaded: dict[int, int]) -> str | None:
    """Why the keys loaded from a shard's file disagree with its manifest entry, or None. Keys with a TTL may
    have expired since the backup, so a db may hold fewer keys, down to keys - expires."""
    for db in sorted(set(shard.keys) | set(loaded)):
        want, got, volatile = shard.keys.get(db, 0), loaded.get(db, 0), shard.expires.get(db, 0)
        if not want - volatile <= got <= want:
            expected = str(want) if not volatile else f"{want - volatile}..{want} ({volatile} with a TTL)"
            return f"db {db} holds {got} keys, the manifest says {expected}"
    return None
