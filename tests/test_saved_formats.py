"""Saved formats (opsctl.base.record.Versioned): every field read back is checked by its type hint, a file without
`format` reads as format 1, and an error names the file and the field, never the value it holds."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from typing import Annotated, ClassVar

import pytest

from opsctl.apply.planfile import parse_plan
from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import DataMismatch, Range, Versioned
from opsctl.plan.steps import STEP_TYPES, RestartNode, StartNode, Step
from opsctl.state.readback import read_record


@frozen
class Where(Frozen):
    host: str
    port: Annotated[int, Range(1, 65535)]
    shard: int | None = None


@frozen
class Saved(Versioned):
    format: ClassVar[int] = 2
    name: str
    ratio: float = 0.0
    on: bool = False
    at: Where | None = None
    pairs: tuple[tuple[str, str], ...] = ()
    counts: tuple[int, ...] = ()
    labels: dict[str, str] | None = None

    @classmethod
    def upgraded(cls, data: dict[str, object], written: int) -> dict[str, object]:
        return {"name": data.get("title", "")} if written == 1 else data

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.name.startswith("-"):
            yield "name", "starts with a dash"


@frozen
class Sparse(Versioned):
    SPARSE: ClassVar[bool] = True
    digest: str | None = None
    flag: bool = False
    kept: dict[str, object] | None = None


FULL = {"format": 2, "name": "n", "ratio": 1, "on": True, "at": {"host": "h", "port": 7000, "shard": None},
        "pairs": [["a", "b"]], "counts": [1, 2], "labels": {"k": "v"}}


def test_a_record_reads_its_own_json_back() -> None:
    saved = Saved.from_json(FULL)
    assert saved == Saved("n", 1.0, True, Where("h", 7000), (("a", "b"),), (1, 2), {"k": "v"})
    assert isinstance(saved.ratio, float) and saved.to_json() == {**FULL, "ratio": 1.0}


def test_a_file_without_format_is_format_1_and_is_upgraded() -> None:
    assert Saved.from_json({"title": "old"}).name == "old"


@pytest.mark.parametrize(("data", "where"), [
    ({**FULL, "format": 3}, "format"), ({**FULL, "format": "2"}, "format"), ({**FULL, "format": True}, "format"),
    ({**FULL, "name": 5}, "name"), ({**FULL, "on": 1}, "on"), ({**FULL, "ratio": True}, "ratio"),
    ({**FULL, "ratio": float("inf")}, "ratio"), ({**FULL, "at": {"host": "h"}}, "at.port"),
    ({**FULL, "at": {"host": "h", "port": 0}}, "at.port"), ({**FULL, "at": {"host": "h", "port": True}}, "at.port"),
    ({**FULL, "at": []}, "at"), ({**FULL, "pairs": [["a"]]}, "pairs[0]"),
    ({**FULL, "pairs": [["a", 1]]}, "pairs[0][1]"),
    ({**FULL, "counts": ["1"]}, "counts[0]"), ({**FULL, "counts": "12"}, "counts"),
    ({**FULL, "labels": {"k": 1}}, "labels.k"), ({**FULL, "extra": 1}, "unknown field 'extra'"),
    ({**FULL, "name": "-x"}, "name: starts with a dash"), ({"format": 2}, "name: is missing"),
])
def test_a_wrong_field_is_named(data: dict[str, object], where: str) -> None:
    with pytest.raises(DataMismatch, match="^" + re.escape(where)):
        Saved.from_json(data)


def test_an_error_names_the_file_and_never_quotes_the_value() -> None:
    with pytest.raises(OpsctlError) as caught:
        read_record(Saved, {**FULL, "name": ["hunter2-secret"]}, "/x/saved.json", "delete it")
    assert str(caught.value) == "/x/saved.json: name: expected a string, found list"
    assert caught.value.hint == "delete it" and "hunter2" not in f"{caught.value} {caught.value.detail}"


def test_a_sparse_record_leaves_defaults_out_and_keeps_unknown_keys() -> None:
    record = Sparse.from_json({"digest": "d", "flag": None, "later": [1]})  # null with a default reads as it
    assert record == Sparse("d", False, {"later": [1]})
    assert record.to_json() == {"digest": "d", "later": [1]} and Sparse().to_json() == {}


PLACED = {"address": "127.0.0.1", "host": "h1", "port": 7000, "role": "master", "shard": 1}
OLD_RECORDS = [  # as opsctl wrote them before records were typed: write_config's, a restart owed, tombstones
    {"applied": 1733500000.25, "deployed": PLACED, "digest": "abc", "directives": [["port", "7000"], ["save", ""]]},
    {"applied": 1733500000.0, "deployed": {**PLACED, "shard": None}, "digest": "abc", "directives": [["a", "b"]],
     "pending_restart": True},
    {"deployed": PLACED, "purging": True, "retired": True}, {"deployed": PLACED, "retired": True},
]


@pytest.mark.parametrize("indent", [None, 2], ids=["local", "ansible"])
@pytest.mark.parametrize("old", OLD_RECORDS)
def test_a_node_record_reads_and_writes_back_byte_for_byte(old: dict[str, object], indent: int | None) -> None:
    from dataclasses import replace

    from opsctl.providers.base import parse_record, record_text

    text = json.dumps(old, sort_keys=True, indent=indent) + "\n"
    record = parse_record(text, "opsctl-node.json")
    assert record_text(record, indent) == text
    done = {k: v for k, v in old.items() if k != "pending_restart"}  # what a restart leaves: the key gone
    assert record_text(replace(record, pending_restart=False), indent) == json.dumps(done, sort_keys=True,
                                                                                     indent=indent) + "\n"


@frozen
class SlotList(Step):
    kind: ClassVar[str] = "test-slot-list"
    slots: tuple[int, ...] = ()


def _plan_with(step: dict[str, object]) -> dict[str, object]:
    return {"format": 1, "spec": "t", "spec_digest": "d", "fingerprint": "f", "steps": [step]}


def test_a_saved_step_field_is_read_by_its_declared_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each field by the step class's type hint, not guessed from its default: a tuple[int, ...] holding a string
    is refused and the error names the file and the field (before, only the list was checked, not its items)."""
    monkeypatch.setitem(STEP_TYPES, SlotList.kind, SlotList)
    step = {"kind": SlotList.kind, "node": "t-1", "reason": "r", "slots": [1, 2]}
    assert parse_plan(_plan_with(step), "plan.json").steps == (SlotList("t-1", "r", (1, 2)),)
    with pytest.raises(OpsctlError) as caught:
        parse_plan(_plan_with({**step, "slots": [1, "2"]}), "plan.json")
    assert str(caught.value) == "plan.json: steps[0].slots[1]: expected a whole number, found string"
    with pytest.raises(OpsctlError, match=r"^plan\.json: steps\[0\]\.members\[0\]: expected a string, found whole"):
        parse_plan(_plan_with({"kind": "form-cluster", "node": "t-1", "reason": "r", "members": [7]}), "plan.json")


def test_every_step_reads_its_own_saved_form_back() -> None:
    for step in (StartNode("t-1", "r"), RestartNode("t-2", "r", True)):
        assert parse_plan(_plan_with(step.to_dict()), "plan.json").steps == (step,)


def test_a_slots_outcome_prints_the_json_and_text_it_always_did() -> None:
    from opsctl.cli.results import SlotsResult
    from opsctl.slots.session import DescribedMove, SlotsOutcome, SlotsSummary

    move = DescribedMove("t-1", "t-4", "0-99", 100, 1200, 65536)
    done = SlotsSummary("slots-done", 100, 100, 1190, 70000, 2380.0, 0.5, None, "atomic")
    result = SlotsResult(SlotsOutcome((move,), done, notes=("n",)))
    assert json.dumps(result.to_dict()) == json.dumps({
        "dry_run": False, "moves": [{"source": "t-1", "target": "t-4", "slots": "0-99", "slot_count": 100,
                                     "est_keys": 1200, "est_bytes": 65536}],
        "summary": {"event": "slots-done", "slots_done": 100, "slots_total": 100, "keys": 1190, "bytes": 70000,
                    "keys_per_sec": 2380.0, "seconds": 0.5, "eta": None, "mode": "atomic"},
        "notes": ["n"]})
    assert result.text() == ("Moves: 1\n  t-1 -> t-4: 100 slots (0-99), ~1200 keys, ~64.0KiB\n  n\n"
                             "moved 100 slots, 1190 keys in 0.50s (2380 keys/s, atomic)")
    assert SlotsResult(SlotsOutcome(dry_run=True)).to_dict() == {"dry_run": True, "moves": [], "summary": {},
                                                                  "notes": []}


def test_a_reader_of_part_of_a_file_passes_the_keys_it_does_not_declare(tmp_path) -> None:
    """The failover report's reader (failover.report.SavedReport) reads the fields the cool-down uses, each checked
    by its type, and passes the rest of what FailoverReport.to_dict wrote."""
    from opsctl.failover.report import SavedReport

    full = {"outcome": "succeeded", "started": 1000, "phases_ms": {"total": 5, "promote": 2.5}, "mode": "graceful",
            "target": {"shard": 1, "master": "a", "replica": None}, "new_master": None, "attempts": []}
    saved = read_record(SavedReport, full, "r.json", "h")
    assert (saved.started, saved.phases_ms.total, saved.target.master, saved.target.replica, saved.new_master) == \
        (1000.0, 5.0, "a", "", "")
    with pytest.raises(OpsctlError, match=r"^r\.json: phases_ms\.total: cannot be negative$"):
        read_record(SavedReport, {**full, "phases_ms": {"total": -1}}, "r.json", "h")


def test_a_segment_header_is_written_as_before_and_read_by_its_types() -> None:
    import time
    from dataclasses import asdict

    from opsctl.backup.segment import MAGIC, SegmentProblem, decode_segment, encode_segment, parse_name
    from opsctl.stream.framing import Entry

    now = time.time()
    name, data = encode_segment(1, "a" * 40, 100, [Entry((b"SET", b"k", b"v"), 131, now - 1)], now, False)
    header, _ = decode_segment(name, data, "w/seg")
    line = data[len(MAGIC):data.index(b"\n", len(MAGIC))]
    assert line == json.dumps(asdict(header), separators=(",", ":")).encode()  # what the dataclass wrote
    bad = data.replace(b'"entries":1', b'"entries":"1"')
    with pytest.raises(SegmentProblem, match=r"^w/seg: has a header that is not one: entries: expected a whole"):
        decode_segment(parse_name(name.text.replace(name.sha256, hashlib.sha256(bad).hexdigest())) or name, bad,
                       "w/seg")
