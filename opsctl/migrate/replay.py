"""Apply one source shard's replication stream to the target masters in order, each command on the master owning
its keys. A batch and its master's marker (the offset of its last command) go out as one script, landing together
or not at all: a resumed run skips exactly what a marker says is in (docs/internals.md). What cannot be carried
stops the run at its offset (opsctl.stream.touched).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.migrate.phases import marker_name
from opsctl.net.rawpipe import RawPipe
from opsctl.net.resp import encode
from opsctl.observe.replies import RespError
from opsctl.restore.engine import Targets
from opsctl.stream.framing import Entry
from opsctl.stream.touched import SPLITTABLE, Kind, absolute_expiry, classify, split

# Runs ARGV's commands (db, marker offset, then count + arguments per command) and sets KEYS[1] to the offset. The
# flag lets one script touch every slot its node serves (no CROSSSLOT among a batch's keys).
SCRIPT = b"""#!lua flags=allow-cross-slot-keys
local db = ARGV[1]
if db ~= '0' then redis.call('SELECT', db) end
local i, n = 3, #ARGV
while i <= n do
  local c = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + c))
  i = i + c + 1
end
if db ~= '0' then redis.call('SELECT', '0') end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
MAX_SCRIPT_ARGS = 7000  # Lua's unpack stops near 8000 values: a bigger command goes out on its own
MAX_BATCH_ARGS = 200_000


class EdgeRefused(RefusedError):
    """A command the target cannot take as the source did, at its replication offset; nothing after it applied."""


class TargetChanged(OpsctlError):
    """A target master answered as a master no more (a failover, a reshard under way): the batch did not land; the
    shard re-reads the target and applies again from its journaled position (the markers skip what landed)."""


MOVED_ON = ("MOVED", "ASK", "CLUSTERDOWN", "READONLY", "TRYAGAIN", "LOADING", "MASTERDOWN")


@dataclass
class Batch:
    db: int
    commands: list[tuple[tuple[bytes, ...], int]] = field(default_factory=list)  # (arguments, end offset)
    end: int = 0
    args: int = 0


class Applier:
    """One source shard's writer into the targets. settled: the offset up to which every command is applied
    (a transaction still open is not); lag: seconds between the oldest command of the last batch arriving and
    its being applied."""

    def __init__(self, targets: Targets, migration: str, shard: str, shift_ms: int, source_ms: float) -> None:
        self.targets = targets
        self.pipes: list[RawPipe] = [targets.open(i) for i in range(len(targets.names))]
        self.markers = [marker_name(migration, shard, _tag_for(targets, i)) for i in range(len(self.pipes))]
        self.shift_ms, self.source_ms = shift_ms, source_ms
        self.label = shard
        self.skip = self._read_markers()
        self.db = 0
        self.multi: list[Entry] | None = None
        self.multi_start = 0
        self.settled = 0
        self.batches: dict[int, list[Batch]] = {}
        self.oldest: float | None = None
        self.lag = 0.0
        self.applied = 0

    def _read_markers(self) -> list[int]:
        out = []
        for pipe, key in zip(self.pipes, self.markers, strict=True):
            reply = pipe.call("GET", key)
            out.append(int(reply) if isinstance(reply, bytes) else 0)
        return out

    def restart(self, offset: int) -> None:
        """The stream continues after offset again (a new link): an open transaction is read again whole."""
        self.multi, self.batches, self.settled, self.db = None, {}, offset, 0

    def feed(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._one(entry)

    def _one(self, entry: Entry) -> None:
        kind = classify(entry.args)
        if self.multi is not None and kind.action not in ("exec", "multi"):
            self.multi.append(entry)
            return
        if kind.action == "multi":
            self.multi, self.multi_start = [], self.settled
            return
        if kind.action == "exec":
            group, self.multi = self.multi or [], None
            self._transaction(group, entry.end)
        elif kind.action == "select":
            self._select(kind.db, entry.end)
        elif kind.action == "refuse":
            self._refuse(entry.end, entry.args, kind.why)
        elif kind.action == "apply":
            self._route(entry, kind)
        self.settled = entry.end

    def _select(self, db: int, end: int) -> None:
        if db != 0 and self.targets.cluster:
            self._refuse(end, (b"SELECT", str(db).encode()), "a cluster has only database 0")
        self.db = db

    def _refuse(self, end: int, args: tuple[bytes, ...], why: str) -> None:
        self.flush()  # the commands before it land first, as the error says
        shown = b" ".join(a[:40] for a in args[:3]).decode("utf-8", "replace")
        raise EdgeRefused(f"source {self.label}: the command ending at replication offset {end} cannot be carried: "
                          f"{shown}", why, "everything before it is applied and journaled; the target is not "
                          "the source's copy from there on: see docs/migrate.md, 'The edges'")

    def _owners(self, entry: Entry, kind: Kind) -> list[int]:
        return [self.targets.router.target(k) for k in kind.keys] or [0]

    def _route(self, entry: Entry, kind: Kind) -> None:
        owners = self._owners(entry, kind)
        args = absolute_expiry(entry.args, self.shift_ms, int(entry.arrived * 1000 + self.source_ms))
        if len(set(owners)) == 1:
            self._add(owners[0], args, entry)
        elif entry.args[0].upper() in SPLITTABLE:
            for target, part in split(args, owners).items():
                self._add(target, part, entry)
        else:
            self._refuse(entry.end, entry.args, "its keys live on different target shards, which no one command "
                         "can touch")

    def _transaction(self, group: list[Entry], end: int) -> None:
        """A MULTI ... EXEC: whole into one target's batch, or refused when its keys span target shards."""
        routed = [(e, classify(e.args)) for e in group]
        owners = {t for e, k in routed if k.action == "apply" for t in self._owners(e, k)}
        for e, k in routed:
            if k.action in ("refuse", "select") and not (k.action == "select" and k.db == self.db):
                self._refuse(e.end, e.args, k.why or "SELECT inside a transaction")
        if len(owners) > 1:
            self._refuse(end, (b"MULTI",), f"the transaction after offset {self.multi_start} touches keys on "
                         f"{len(owners)} target shards; none of them can run it whole")
        target = owners.pop() if owners else 0
        for e, k in routed:
            if k.action == "apply":
                self._add(target, absolute_expiry(e.args, self.shift_ms, int(e.arrived * 1000 + self.source_ms)),
                          e, end, hold=True)
        self._close(target, end)

    def _add(self, target: int, args: tuple[bytes, ...], entry: Entry, end: int = 0,
             hold: bool = False) -> None:
        if entry.end <= self.skip[target]:
            return  # a marker says an earlier run applied it
        batches = self.batches.setdefault(target, [])
        if not batches or batches[-1].db != self.db or (batches[-1].args > MAX_BATCH_ARGS and not hold):
            batches.append(Batch(self.db))
        batch = batches[-1]
        batch.commands.append((args, entry.end))
        batch.args += len(args)
        batch.end = max(batch.end, end or entry.end)
        self.oldest = entry.arrived if self.oldest is None else min(self.oldest, entry.arrived)

    def _close(self, target: int, end: int) -> None:
        if target in self.batches:
            self.batches[target][-1].end = max(self.batches[target][-1].end, end)

    def flush(self) -> int:
        """Every batch applied (its marker with it); returns the offset settled."""
        sent: list[tuple[int, int]] = []
        for target, batches in self.batches.items():
            pipe = self.pipes[target]
            count = 0
            for batch in batches:
                count += self._send(pipe, target, batch)
            sent.append((target, count))
        for target, count in sent:
            for reply in self.pipes[target].read(count):
                if isinstance(reply, RespError) and reply.message.startswith(MOVED_ON):
                    raise TargetChanged(f"target {self.targets.names[target]} no longer takes the writes of "
                                        f"source {self.label}", reply.message[:300])
                if isinstance(reply, RespError):
                    raise OpsctlError(f"target {self.targets.names[target]} refused a write of source {self.label}",
                                      reply.message[:300], "the target changed under the migration (a reshard, "
                                      "a failover, full memory?); fix it, then re-run: it resumes")
            self.skip[target] = max(self.skip[target], *(b.end for b in self.batches[target]))
        self.applied += sum(len(b.commands) for bs in self.batches.values() for b in bs)
        self.batches = {}
        if self.oldest is not None:
            self.lag, self.oldest = time.time() - self.oldest, None
        else:
            self.lag = 0.0
        return self.settled if self.multi is None else self.multi_start

    def _send(self, pipe: RawPipe, target: int, batch: Batch) -> int:
        """The batch as scripts (a command too big for one alone, with its marker after it); replies due."""
        out: list[bytes] = []
        due, last = 0, 0
        chunk: list[tuple[bytes, ...]] = []
        for command, end in batch.commands:
            if len(command) > MAX_SCRIPT_ARGS:
                if chunk:
                    out.append(self._script(target, batch.db, chunk, last))
                    due, chunk = due + 1, []
                out.append(encode(list(command)))
                out.append(encode([pipe.name("SET"), self.markers[target], end]))
                due += 2
            else:
                chunk.append(command)
            last = end
        if chunk:
            out.append(self._script(target, batch.db, chunk, batch.end))
            due += 1
        pipe.send(b"".join(out))
        return due

    def _script(self, target: int, db: int, commands: list[tuple[bytes, ...]], end: int) -> bytes:
        words: list[bytes | int] = [self.pipes[target].name("EVAL"), SCRIPT, 1, self.markers[target], db, end]
        for command in commands:
            words.append(len(command))
            words.extend(command)
        return encode(words)

    def drop_markers(self) -> None:
        """The markers gone (cutover: the target is the clients' now)."""
        for pipe, key in zip(self.pipes, self.markers, strict=True):
            pipe.call("DEL", key)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.close()


def _tag_for(targets: Targets, index: int) -> str:
    """A hash tag whose slot target index owns (any tag for a single target)."""
    for n in range(100_000):
        if targets.router.target(f"{{m{n}}}".encode()) == index:
            return f"m{n}"
    raise OpsctlError(f"target {targets.names[index]} owns no slot")
