"""Read a plan saved with `opsctl plan --out FILE` back, checking every field before apply compares it."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from opsctl.base.errors import StalePlan
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import Versioned
from opsctl.plan.steps import PROMOTE_MODES, STEP_TYPES, Plan, PromoteReplica, Step
from opsctl.state.readback import load_json, read_record
from opsctl.state.safefs import FileProblem

PLAN_HINT = "make it again with `opsctl plan -f SPEC --out FILE`"
PLAN_LIMIT = 64 * 1024 * 1024


def read_saved_plan(path: Path | str) -> Plan:
    return parse_plan(load_json(path, PLAN_HINT, PLAN_LIMIT), path)


@frozen
class SavedPlan(Frozen):
    """A plan saved with `plan --out` (apply --plan), and where it was read from (named in its refusals)."""

    path: str
    plan: Plan

    @classmethod
    def read(cls, path: Path | str) -> SavedPlan:
        return cls(str(path), read_saved_plan(path))

    def checked(self, current: Plan) -> Plan:
        """This plan, when it is what opsctl would do now (current); StalePlan when the spec, the live topology or
        the steps moved since it was made."""
        saved = self.plan
        for moved, what in ((saved.spec_digest != current.spec_digest, "the spec changed since the plan was made"),
                            (saved.fingerprint != current.fingerprint,
                             "the live topology changed since the plan was made"),
                            (saved.steps != current.steps,
                             "the saved plan's steps differ from what opsctl would do now")):
            if moved:
                raise StalePlan(what, f"plan: {self.path}", "run opsctl plan --out again and review it")
        return saved


@frozen
class PlanFile(Versioned):
    """A plan saved with `plan --out` (Plan.to_dict, which names its format), read back by its types; each step by
    the class of its kind (_step)."""

    spec: str
    spec_digest: str
    fingerprint: str
    steps: tuple[object, ...]
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    replan: bool = False
    summary: str = ""


def parse_plan(data: object, path: Path | str) -> Plan:
    """Plan.to_dict's JSON back into a Plan, every field checked (path: where it came from, for errors)."""
    saved = read_record(PlanFile, data, path, PLAN_HINT)
    steps = tuple(_step(step, path, f"steps[{i}]") for i, step in enumerate(saved.steps))
    return Plan(saved.spec, saved.spec_digest, saved.fingerprint, steps, saved.notes, saved.warnings, saved.replan,
                saved.summary)


@frozen
class StepKind(Versioned):
    """What a saved step is (its kind), read first: its class then reads the rest."""

    READS_PART: ClassVar[bool] = True
    kind: str


def _step(data: object, path: Path | str, where: str) -> Step:
    """A step of its kind, each field read by the type the step class declares (base.record's checker: a
    tuple[int, ...] holding a string is refused, naming the field)."""
    cls = STEP_TYPES.get(read_record(StepKind, data, path, PLAN_HINT, where).kind)
    if cls is None:
        raise FileProblem(path, f"{where}.kind: unknown step kind (known: {', '.join(sorted(STEP_TYPES))})",
                          PLAN_HINT)
    fields = {k: v for k, v in data.items() if k != "kind"} if isinstance(data, dict) else data  # an object: read
    made = read_record(cls, fields, path, PLAN_HINT, where)
    if isinstance(made, PromoteReplica) and made.mode not in PROMOTE_MODES:  # CLUSTER FAILOVER's option
        raise FileProblem(path, f"{where}.mode: mode {made.mode!r} is not one of {', '.join(PROMOTE_MODES)}",
                          PLAN_HINT)
    return made
