"""A journaled slot the target serves, whose source (a replica promoted mid-move) neither serves nor migrates it
but holds copies of its keys: no MIGRATING can be set there ("I'm not the owner"), so the slot is assigned and
the copies are handed over as strays (issue 23, class 2). Pure."""

from __future__ import annotations

from opsctl.slots.journal import SlotState, decide


def test_a_promoted_sources_copies_of_a_moved_slot_are_strays_not_a_move_to_finish() -> None:
    promoted = SlotState(source_owns=False, target_owns=True, migrating=False, importing=False, source_keys=3,
                         target_keys=3)
    assert decide(promoted) == "assign"
    migrating = SlotState(source_owns=True, target_owns=True, migrating=True, importing=False, source_keys=3,
                          target_keys=0)
    assert decide(migrating) == "finish"  # the source still migrates it: move what is left
