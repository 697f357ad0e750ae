"""`opsctl switchover -f STANDBY --primary-lost`: the primary's site is gone, so nothing can fence it. The link is
stopped already (no `opsctl follow` may run: the state lock says so); the standby's markers go, its fence is lifted
on every server and the switch recorded, and the report names the recovery point per source shard: the offset up to
which the link had read the primary's stream and applied it, and when it read it (the journal's). Every write of
the primary up to that offset is on the standby; later ones are not. The offset is the journal's or, when every
target master holds a marker, the lowest marker's if higher: a marker lands with its batch (every command of the
shard up to the lowest one is applied on its target), the journal is written after (a link killed between the two
leaves it behind). docs/standby.md, "A lost site"."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from opsctl.base.errors import RefusedError
from opsctl.migrate.phases import JournalFile, read_journal
from opsctl.migrate.replay import Applier
from opsctl.restore.target import inspect_target
from opsctl.spec.load import LoadedSpec
from opsctl.standby.link import follower_of, lift_fence, refuse_switched
from opsctl.standby.primary import primary_of
from opsctl.state.standbyfiles import LAG, Switched, record_switched


@dataclass(frozen=True)
class TakenOver:
    """recovery: per source shard its offset and when the link read it (epoch seconds); missed: servers whose fence
    could not be lifted; point_to: the standby's masters."""

    name: str
    recovery: dict[str, dict[str, float]]
    point_to: tuple[str, ...]
    missed: tuple[str, ...]

    def line(self) -> str:
        points = "; ".join(f"{shard} up to offset {int(r['offset'])}, read {_utc(r['at'])}"
                           for shard, r in sorted(self.recovery.items()))
        missed = f"; the fence is still on {', '.join(self.missed)} (apply the spec without follows:)" \
            if self.missed else ""
        return (f"switched over with the primary lost: '{self.name}' takes writes; recovery point: {points} (every "
                f"write of the primary up to there is on the standby, none after){missed}; point clients at "
                f"{', '.join(self.point_to)}")


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d} UTC" if at else \
        "at an unknown time"


def take_over(loaded: LoadedSpec, state_dir: Path, force_lock: bool = False) -> TakenOver:
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.statelock import state_lock

    refuse_switched(loaded, state_dir)
    primary = primary_of(loaded)
    with state_lock(state_dir), open_connector(loaded, state_dir) as admin, \
            topology_lock(admin, force=force_lock):
        journal = read_journal(state_dir)
        copying = sorted(k for k, s in (journal.shards if journal else {}).items() if s.phase != "stream")
        if journal is None or not journal.shards or copying:
            raise RefusedError(f"'{loaded.spec.name}' holds only part of its primary's data: "
                               f"{', '.join(copying) or 'no shard'} had not finished its copy",
                               "a switchover with the primary lost takes over what the standby holds; a partial copy "
                               "is no recovery point", "bring the primary back and let `opsctl follow` finish the "
                               "copy, or restore a backup into the standby")
        follower = follower_of(loaded, admin)
        target = inspect_target(follower)
        targets = target.targets()
        applied: dict[str, int] = {}
        for shard in journal.shards:
            applier = Applier(targets, journal.id, shard, 0, 0.0)
            applied[shard] = min(applier.skip) if all(applier.skip) else 0
            applier.drop_markers()
            applier.close()
        missed = lift_fence(admin).missed
        recovery = {k: {"offset": float(max(s.position.offset, applied[k])), "at": s.at}
                    for k, s in journal.shards.items()}
        record_switched(state_dir, Switched(time.time(), primary.shown, "primary-lost", recovery))
        (state_dir / LAG).unlink(missing_ok=True)
        journal.finished = True
        JournalFile(state_dir, journal).save()
        return TakenOver(loaded.spec.name, recovery, tuple(m.endpoint for m in target.masters), tuple(missed))
