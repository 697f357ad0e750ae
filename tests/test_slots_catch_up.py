"""The key mover's closer catches up (issue 37): a close costs the same few turns of the source and the target
whatever its size, so the waves whose keys all moved while a close ran are drained and closed together, in one
close (one journal line), not one close each behind the stream. Live, key by key on both servers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from opsctl.base.poll import Pending, wait_for
from opsctl.net.connector import Connector
from opsctl.net.observer import wait_cluster_converged
from opsctl.slots.journal import Journal
from opsctl.slots.keys import KeyMover, Options
from opsctl.slots.progress import Progress
from opsctl.slots.session import open_session
from tests.lifecycle import deployed
from tests.support import CONDITION_BOUND
from tests.test_slots_reshard import referee_ok
from tests.writer import cluster_client

pytestmark = pytest.mark.integration

SLOTS = range(0, 10)  # waves of 2, 4 and 4 slots (first_wave 2, wave_slots 4): all three open at once
KEYS_PER_SLOT = 3


class HeldFirstClose(Journal):
    """The journal of a run whose first close is held until every key moved (a closer behind the stream)."""

    def __init__(self, state_dir: Path, total: int) -> None:
        super().__init__(state_dir)
        self.total = total
        self.mover: KeyMover | None = None
        self.closes: list[list[int]] = []

    def closed(self, slots: Sequence[int]) -> None:
        if not self.closes:
            wait_for(self._all_moved, CONDITION_BOUND, "every wave's keys to move")
        self.closes.append(sorted(slots))
        super().closed(slots)

    def _all_moved(self) -> bool | Pending:
        moved = self.mover.moved if self.mover else 0
        return True if moved >= self.total else Pending(f"{moved} of {self.total} keys moved")


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_waves_read_while_a_close_runs_close_together(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        client = cluster_client(loaded)
        written: dict[str, str] = {}
        for slot in SLOTS:
            tag = next(f"t{i}" for i in range(10**6) if client.keyslot(f"t{i}") == slot)
            keys = {f"{{{tag}}}:{n}": f"v{n}" for n in range(KEYS_PER_SLOT)}
            client.mset(keys)
            written.update(keys)
        total = len(written)
        journal = HeldFirstClose(spec.parent / ".opsctl" / loaded.spec.name, total)
        with open_session(Connector(loaded)) as session:
            source = next(p for p in session.masters() if 0 in session.owned()[p.name])
            target = next(p for p in session.masters() if p.name != source.name)
            mover = KeyMover(session, source, target, journal, Progress(lambda _: None, len(SLOTS)),
                             lambda _: None, Options(first_wave=2, wave_slots=4))
            journal.mover = mover
            mover.move(list(SLOTS))
        assert mover.moved == total
        # the first wave alone (held), then the two read meanwhile in one close; before, one close a wave
        assert journal.closes == [[0, 1], list(range(2, 10))]
        assert journal.pending() == []
        assert {key: client.get(key) for key in written} == written  # every key on the target, as written
        wait_cluster_converged(Connector(loaded), loaded.layout.servers)  # as a run waits after its moves
        referee_ok(loaded)
