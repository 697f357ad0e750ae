"""What a running operation tells people: one typed event per kind, and one printer that shows them as text
(a progress bar redrawn in place on a terminal) or as JSON lines. apply, restart and the `cluster` slot
commands all report through these."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import ClassVar

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.runevents import Replanning, RoundDone, Tagged
from opsctl.base.words import gauge, human_bytes, human_seconds, plural


@frozen
class StepStart(Frozen):
    kind: ClassVar[str] = "step-start"
    index: int
    total: int
    step: str

    def line(self) -> str:
        return f"[{self.index}/{self.total}] {self.step} ..."


@frozen
class StepDone(Frozen):
    kind: ClassVar[str] = "step-done"
    index: int
    step: str
    seconds: float

    def line(self) -> str:
        return f"[{self.index}] done in {self.seconds:.2f}s"


@frozen
class StepFailed(Frozen):
    """The error itself is printed once, by the CLI, when the run stops."""

    kind: ClassVar[str] = "step-failed"
    index: int
    step: str
    error: str

    def line(self) -> str:
        return f"[{self.index}] failed"


@frozen
class Log(Frozen):
    kind: ClassVar[str] = "log"
    step: str
    text: str

    def line(self) -> str:
        return f"      {self.text}"


@frozen
class Note(Frozen):
    """A line a runbook says as it goes (a pre-check, a promotion, a node reloaded), outside any plan step."""

    kind: ClassVar[str] = "note"
    text: str

    def line(self) -> str:
        return self.text


@frozen
class ScanProgress(Frozen):
    """Keys an audit scan has read on one node so far, of the node's DBSIZE when it started."""

    kind: ClassVar[str] = "scan-progress"
    node: str
    done: int
    total: int

    def line(self) -> str:
        return f"{self.node}: {self.done}/{self.total} keys scanned"


@frozen
class SlotsStart(Frozen):
    """moves: each move's source, target, slots, slot_count, est_keys and est_bytes."""

    kind: ClassVar[str] = "slots-start"
    mode: str
    slot_count: int
    moves: tuple[Mapping[str, str | int], ...]

    def line(self) -> str:
        return f"moving {self.slot_count} slots ({self.mode})"


@frozen
class SlotsProgress(Frozen):
    """Counters of a slot operation so far; eta in seconds, None while too early to say."""

    kind: ClassVar[str] = "slots-progress"
    slots_done: int
    slots_total: int
    keys: int
    bytes: int
    keys_per_sec: float
    seconds: float
    eta: float | None

    def line(self, width: int = 24) -> str:
        """`[#####.....] 120/4096 slots  53000 keys  12.0MiB  91000 keys/s  ETA 3s`."""
        return (f"{gauge(self.slots_done, self.slots_total, width)} {self.slots_done}/{self.slots_total} slots  "
                f"{self.keys} keys  {human_bytes(self.bytes)}  {self.keys_per_sec:.0f} keys/s  "
                f"ETA {human_seconds(self.eta)}")


@frozen
class SlotsDone(SlotsProgress):
    kind: ClassVar[str] = "slots-done"


@frozen
class BigKey(Frozen):
    kind: ClassVar[str] = "big-key"
    slot: int
    key: str
    bytes: int
    timeout_ms: int

    def line(self) -> str:
        return (f"big-key: slot {self.slot}, {self.key!r}, {human_bytes(self.bytes)}: moved alone, "
                f"MIGRATE timeout {self.timeout_ms} ms")


@frozen
class MigrateRetry(Frozen):
    kind: ClassVar[str] = "migrate-retry"
    slot: int
    keys: int
    error: str

    def line(self) -> str:
        return f"migrate-retry: slot {self.slot}, {self.keys} keys: {self.error}"


@frozen
class BusyKeyEqual(Frozen):
    kind: ClassVar[str] = "busy-key-equal"
    slot: int
    key: str

    def line(self) -> str:
        return f"busy-key-equal: slot {self.slot}, {self.key!r} was on the target already, equal: replaced"


@frozen
class Closed(Frozen):
    """Open slots closed: actions maps finish/assign/cancel to the slot ranges it applied to."""

    kind: ClassVar[str] = "closed"
    source: str
    target: str
    journaled: bool
    actions: Mapping[str, str]

    def line(self) -> str:
        origin = "journaled" if self.journaled else "found open"
        done = ", ".join(f"{action} {slots}" for action, slots in sorted(self.actions.items()))
        return f"closed: {self.source} -> {self.target} ({origin}): {done}"


@frozen
class SlotsSkip(Frozen):
    kind: ClassVar[str] = "slots-skip"
    step: str
    why: str

    def line(self) -> str:
        return f"slots-skip: {self.step}: {self.why}"


@frozen
class SlotsClosed(Frozen):
    kind: ClassVar[str] = "slots-closed"
    what: str

    def line(self) -> str:
        return f"slots-closed: {self.what}"


@frozen
class EndpointDown(Frozen):
    """A node a slot move goes from (source) or to (target) does not answer, or is flagged failing."""

    kind: ClassVar[str] = "endpoint-down"
    role: str
    node: str

    def line(self) -> str:
        return f"endpoint-down: the {self.role} {self.node} does not answer: waiting, no SETSLOT meanwhile"


@frozen
class EndpointReplacedEvent(Frozen):
    """The cluster failed over the shard of a move's source or target; the move follows the shard."""

    kind: ClassVar[str] = "endpoint-replaced"
    role: str
    node: str

    def line(self) -> str:
        return (f"endpoint-replaced: the {self.role} {self.node} was failed over: the move goes on with its "
                "shard's new master")


@frozen
class BackupStart(Frozen):
    """savers: shard number -> the node that saves it."""

    kind: ClassVar[str] = "backup-start"
    shards: int
    dir: str
    savers: Mapping[int, str]

    def line(self) -> str:
        return f"backing up {self.shards} shards into {self.dir}"


@frozen
class ShardCopying(Frozen):
    """A shard's copy arriving from its saver: bytes so far, of about estimate (its data in memory)."""

    kind: ClassVar[str] = "shard-copying"
    shard: int
    node: str
    bytes: int
    estimate: int

    def line(self) -> str:
        return f"shard {self.shard}: {human_bytes(self.bytes)} of about {human_bytes(self.estimate)} received from " \
               f"{self.node}"


@frozen
class ShardSaved(Frozen):
    kind: ClassVar[str] = "shard-saved"
    shard: int
    node: str
    role: str
    bytes: int
    done: int
    total: int

    def line(self) -> str:
        return (f"{gauge(self.done, self.total, 20)} {self.done}/{self.total} shards saved, shard {self.shard} "
                f"{human_bytes(self.bytes)} from {self.node} ({self.role})")


@frozen
class BackupDone(Frozen):
    kind: ClassVar[str] = "backup-done"
    dir: str
    keys: int
    bytes: int
    seconds: float

    def line(self) -> str:
        return f"saved {self.keys} keys ({human_bytes(self.bytes)}) in {self.seconds:.1f}s"


@frozen
class SegmentArchived(Frozen):
    """A segment of a shard's replication stream is durable in the store (continuous archive). first/last: when its
    first and last command were read; durable: when the store confirmed it (all unix times)."""

    kind: ClassVar[str] = "segment-archived"
    shard: int
    name: str
    start: int
    end: int
    entries: int
    bytes: int
    first: float
    last: float
    durable: float

    def line(self) -> str:
        return (f"shard {self.shard}: {self.entries} commands archived (offsets {self.start}..{self.end}, "
                f"{human_bytes(self.bytes)}), {self.durable - self.first:.2f}s after the first was read")


@frozen
class ArchiveProgress(Frozen):
    """The continuous archive is alive: since its base, `segments` stored holding `bytes`; shards: each shard's
    offset archived up to. Said every second, also when no write comes (a heartbeat off a terminal)."""

    kind: ClassVar[str] = "archive-progress"
    base: str
    segments: int
    bytes: int
    shards: Mapping[int, int]

    def line(self) -> str:
        offsets = ", ".join(f"shard {shard} at offset {offset}" for shard, offset in sorted(self.shards.items()))
        return (f"archiving base {self.base}: {plural(self.segments, 'segment')} ({human_bytes(self.bytes)}) stored; "
                f"{offsets}")


@frozen
class ArchiveStopped(Frozen):
    """backup --continuous was stopped as a service is (SIGTERM, SIGINT): a normal end, its last line."""

    kind: ClassVar[str] = "archive-stopped"
    signal: str
    detail: str

    def line(self) -> str:
        return f"the continuous archive stopped on {self.signal}: {self.detail}"


@frozen
class ChecksumsOk(Frozen):
    kind: ClassVar[str] = "checksums-ok"
    files: int

    def line(self) -> str:
        return f"checksums of {self.files} files match the manifest"


@frozen
class ShardVerified(Frozen):
    kind: ClassVar[str] = "shard-verified"
    shard: int
    file: str
    keys: int

    def line(self) -> str:
        return f"verified shard {self.shard} ({self.file}): {self.keys} keys"


@frozen
class VerifyDone(Frozen):
    kind: ClassVar[str] = "verify-done"
    ok: bool
    keys: int

    def line(self) -> str:
        return f"verified {self.keys} keys"


@frozen
class RestoreProgress(Frozen):
    """Keys written so far of total (0: unknown, a live source)."""

    kind: ClassVar[str] = "restore-progress"
    keys: int
    total: int
    keys_per_sec: int
    seconds: float

    def line(self) -> str:
        eta = (self.total - self.keys) / self.keys_per_sec if self.total and self.keys_per_sec else None
        head = (f"{gauge(self.keys, self.total, 20)} {self.keys}/{self.total} keys" if self.total
                else f"{self.keys} keys")
        return f"{head}  {self.keys_per_sec} keys/s  ETA {human_seconds(eta)}"


@frozen
class RestoreDone(Frozen):
    """The restore's report; sources maps each source to its counts (keys, restored, existing, skipped,
    conflicts)."""

    kind: ClassVar[str] = "restore-done"
    source: str
    target: str
    mode: str
    dry_run: bool
    resumed: bool
    ok: bool
    keys: int
    restored: int
    existing: int
    skipped: int
    conflicts: int
    seconds: float
    keys_per_sec: int | None
    verified: int
    problems: tuple[str, ...]
    sources: Mapping[str, Mapping[str, int]]
    rechecked: bool = False  # the same restore had finished: checked again, nothing copied

    def line(self) -> str:
        if self.rechecked:
            return f"restore of {self.keys} keys had finished before: checked again, nothing copied"
        return (f"restore of {self.keys} keys {'finished' if self.ok else 'found problems'} in "
                f"{self.seconds:.1f}s")


@frozen
class RestoreDryRun(RestoreDone):
    kind: ClassVar[str] = "restore-dry-run"

    def line(self) -> str:
        return "dry run: every check passed, nothing was written"


@frozen
class MigrateLag(Frozen):
    """A live migration's progress: per source shard its phase, keys copied, commands applied, and how far the
    target trails the source (bytes of stream, seconds since the oldest unapplied command arrived)."""

    kind: ClassVar[str] = "migrate-lag"
    shards: Mapping[str, Mapping[str, object]]

    def line(self) -> str:
        parts = []
        for name, s in self.shards.items():
            if s.get("phase") == "stream":
                parts.append(f"{name}: lag {human_bytes(int(str(s.get('lag_bytes', 0))))} "
                             f"{float(str(s.get('lag_seconds', 0.0))):.2f}s, {s.get('applied', 0)} applied")
            else:
                parts.append(f"{name}: {s.get('phase')}, {s.get('copied', 0)} keys copied")
        return "  ".join(parts)


@frozen
class CutoverDone(Frozen):
    """A cutover's report: counted from fencing the source, the target applied every shard's final offset after
    caught_up_s and was verified and ready after pause_s (the least write pause clients see)."""

    kind: ClassVar[str] = "cutover-done"
    ok: bool
    pause_s: float
    caught_up_s: float
    source_keys: int
    target_keys: int
    verified: int
    final_offsets: Mapping[str, int]
    point_to: tuple[str, ...]
    problems: tuple[str, ...]

    def line(self) -> str:
        if not self.ok:
            return ("cutover failed verification; the source's write fence is lifted, it serves writes again:\n"
                    + "\n".join(f"  {p}" for p in self.problems))
        return (f"cutover done: write pause {self.pause_s:.3f}s (caught up after {self.caught_up_s:.3f}s), "
                f"{self.target_keys} keys ({self.source_keys} on the source), {self.verified} sampled keys equal; "
                f"point clients at {', '.join(self.point_to)}")


@frozen
class PlaybookTask(Frozen):
    """A task of an Ansible playbook finished on a host: ok, changed, failed, unreachable or skipped."""

    kind: ClassVar[str] = "playbook-task"
    playbook: str
    host: str
    task: str
    status: str

    def line(self) -> str:
        return f"{self.playbook}: {self.host}: {self.status}: {self.task}"


Event = (StepStart | StepDone | StepFailed | Log | Note | ScanProgress | SlotsStart | SlotsProgress | BigKey
         | MigrateRetry
         | BusyKeyEqual | Closed | SlotsSkip | SlotsClosed | EndpointDown | EndpointReplacedEvent
         | BackupStart | ShardCopying | ShardSaved | BackupDone | SegmentArchived | ArchiveProgress | ArchiveStopped
         | ChecksumsOk | ShardVerified | VerifyDone | RestoreProgress | RestoreDone | PlaybookTask | MigrateLag
         | CutoverDone | RoundDone | Replanning | Tagged)
# a bar on a terminal; elsewhere a heartbeat: the newest one as a line every HEARTBEAT seconds (CI logs)
REDRAWN = (SlotsProgress, ShardCopying, ShardSaved, RestoreProgress, PlaybookTask, MigrateLag, SegmentArchived,
           ArchiveProgress)
HEARTBEAT = 5.0
# on the bar only: off a terminal the archive's heartbeat is its summary (ArchiveProgress), not one shard's segment
BAR_ONLY = (SegmentArchived,)
Emit = Callable[[Event], None]


def as_dict(event: Event) -> dict[str, object]:
    """The JSON form: {"event": kind, field: value, ...}."""
    if isinstance(event, Tagged):
        return event.as_dict()
    return {"event": event.kind, **dataclasses.asdict(event)}


def as_log(emit: Emit, step: str) -> Emit:
    """emit, with a runbook's notes shown as lines of the plan step that runs it."""
    return lambda event: emit(Log(step, event.text) if isinstance(event, Note) else event)


def ignore(event: Event) -> None:
    """An Emit that shows nothing."""

