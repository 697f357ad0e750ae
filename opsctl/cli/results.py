"""What each command prints when it is done, as a typed value (opsctl.cli.output.Result): its text for people and
the object --output json prints (inside opsctl.cli.output.envelope). The keys of each object are the ones scripts
read today; a result's text is the command's text output, byte for byte.

The cluster, slot and failover results import their text functions when asked, so that plan and status load
none of those modules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opsctl.base.frozen import Frozen, frozen
from opsctl.cli.report import NodeStatus, plan_text, status_table

if TYPE_CHECKING:
    from opsctl.cluster.check import ClusterReport
    from opsctl.failover.report import FailoverReport
    from opsctl.plan.steps import Plan
    from opsctl.slots.session import Outcome


@frozen
class PlanResult(Frozen):
    """plan, and the plan apply and restart show before they run it: its steps, or "no changes"."""

    plan: Plan

    def text(self) -> str:
        return plan_text(self.plan)

    def to_dict(self) -> dict[str, Any]:
        return self.plan.to_dict()


@frozen
class StatusResult(Frozen):
    """status, and the status apply and restart show when done. healthy: every node answers as the spec says;
    health: the line that says so or why not; hint: how to get healthy (None when healthy)."""

    spec: str
    topology: str
    healthy: bool
    health: str
    nodes: tuple[NodeStatus, ...]
    hint: str | None

    def text(self) -> str:
        return f"{status_table(list(self.nodes))}\n{self.health}"

    def to_dict(self) -> dict[str, object]:
        return {"spec": self.spec, "topology": self.topology, "healthy": self.healthy, "health": self.health,
                "nodes": [row.as_dict() for row in self.nodes]}


@frozen
class ClusterCheckResult(Frozen):
    """cluster check: coverage, open slots and agreement of the cluster's nodes."""

    report: ClusterReport

    def text(self) -> str:
        from opsctl.cluster.check import report_text

        return report_text(self.report)

    def to_dict(self) -> dict[str, Any]:
        return self.report.to_dict()


@frozen
class SlotsResult(Frozen):
    """cluster reshard, rebalance and fix: the moves made (or, in a dry run, that would be), their summary and
    notes."""

    outcome: Outcome

    def text(self) -> str:
        from opsctl.slots.cli import outcome_text

        return outcome_text(self.outcome)

    def to_dict(self) -> dict[str, object]:
        outcome = self.outcome
        return {"dry_run": outcome.dry_run, "moves": outcome.moves, "summary": outcome.summary,
                "notes": outcome.notes}


@frozen
class FailoverResult(Frozen):
    """failover: the whole report as JSON; as text its last line (the outcome), the steps having printed as
    they ran."""

    report: FailoverReport

    def text(self) -> str:
        from opsctl.failover.report import report_text

        return report_text(self.report).splitlines()[-1]

    def to_dict(self) -> dict[str, Any]:
        return self.report.to_dict()
