"""Planning, apply's first half: the plan operation (plan: a PlanResult, saved with --out), the settled facts and
the spec made into a plan (compute_plan), the plan as text for people, the shards a scale-out was filling, the
refusal of nodes that do not answer, the spec's digest, and the warning for node ports inside the machine's
ephemeral port range (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsctl.base.errors import OpsctlError, is_auth_failure, is_tls_failure
from opsctl.base.events import Emit, ignore, plural
from opsctl.base.frozen import Frozen, frozen
from opsctl.plan.facts import NodeFacts
from opsctl.render.directives import listen_ports
from opsctl.runtime.gather import desired_state, settled_facts
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Node, exporter_port
from opsctl.spec.load import LoadedSpec

if TYPE_CHECKING:  # the planner, its steps and the disk facts load for plan and apply, not for status
    from opsctl.plan.steps import Plan

@frozen
class PlanOptions(Frozen):
    """out: also save the plan there, as JSON for apply --plan (plan --out)."""

    out: Path | None = None


@frozen
class PlanResult(Frozen):
    """plan, and the plan apply and restart show before they run it: its steps, or "no changes". saved_to: where
    it was saved (plan --out); origins: the merged spec asked for with --show-origins (JSON only)."""

    plan: Plan
    saved_to: Path | None = None
    origins: tuple[dict[str, object], ...] | None = None  # --show-origins: the merged spec, each value's file:line

    @property
    def changes(self) -> bool:
        return not self.plan.empty

    def text(self) -> str:
        return plan_text(self.plan)

    def to_dict(self) -> dict[str, Any]:
        shown = self.plan.to_dict()
        return shown if self.origins is None else {**shown, "spec_origins": list(self.origins)}


JUST_PLAN = PlanOptions()


def plan(rt: Runtime, options: PlanOptions = JUST_PLAN, emit: Emit = ignore) -> PlanResult:
    """What apply would change now, from a look at every node (a wait for nodes between states said to emit);
    saved to options.out when given."""
    made, _ = compute_plan(rt, emit)
    if options.out is not None:
        import json

        from opsctl.state.safefs import write_private

        write_private(options.out, json.dumps(made.to_dict(), indent=2) + "\n")
    return PlanResult(made, options.out)


def plan_text(plan: Plan) -> str:
    """The plan for people: a summary line, each step with why, and each setting a write changes, before -> after
    (secrets as verdicts or ***, as the step holds them)."""
    from opsctl.plan.steps import WriteConfig

    if plan.empty:
        return "\n".join(["Plan: no changes.", *(f"  {note}" for note in plan.notes)])
    lines = [f"Plan: {plural(len(plan.steps), 'step')} for '{plan.spec_name}':"]
    lines += [f"  {plan.summary}"] if plan.summary else []
    for i, step in enumerate(plan.steps, start=1):
        lines.append(f"  {i:>3}. {step.title()}")
        lines.append(f"       why: {step.reason}")
        if isinstance(step, WriteConfig):
            lines += [f"       {name}: {before} -> {after}" for name, before, after in step.changes]
    lines += [f"  warning: {w}" for w in plan.warnings]
    lines += [f"  then: {note}" for note in plan.notes if plan.replan]
    return "\n".join(lines)



def spec_digest(loaded: LoadedSpec) -> str:
    from opsctl.base.record import digest

    return digest(loaded.spec.model_dump(mode="json"))

def compute_plan(rt: Runtime, emit: Emit = ignore) -> tuple[Plan, dict[str, NodeFacts]]:
    from opsctl.plan.planner import make_plan
    from opsctl.plan.refusals import refuse_layout_change

    facts = settled_facts(rt, emit=emit)
    if rt.loaded.spec.topology == "cluster":  # first: a node the spec moved to another host does not answer there
        refuse_layout_change(rt.loaded.layout, facts)
    refuse_silent_nodes(facts, rt.loaded.spec.tls.enabled)
    plan = make_plan(rt.loaded, desired_state(rt, facts), facts, spec_digest(rt.loaded), filling(rt))
    return _with_port_warning(rt.loaded, plan), facts

def filling(rt: Runtime) -> list[int]:
    """The shards a cluster's scale-out was filling when its apply stopped (the slot journal's fill entries)."""
    if rt.loaded.spec.topology != "cluster":
        return []
    from opsctl.slots.journal import Journal

    return Journal(rt.state_dir).filling()

def _with_port_warning(loaded: LoadedSpec, plan: Plan) -> Plan:
    """Local nodes listening inside this machine's ephemeral port range: warned in the plan."""
    if loaded.spec.provider != "local":
        return plan
    from dataclasses import replace

    from opsctl.providers.proc import ephemeral_port_range

    ports = ephemeral_port_range()
    warning = ephemeral_port_warning(loaded, *ports) if ports else None
    return replace(plan, warnings=(*plan.warnings, warning)) if warning else plan

def refuse_silent_nodes(facts: dict[str, NodeFacts], tls: bool = False) -> None:
    """A node whose process runs but does not answer cannot be planned for safely: say which and why."""
    silent = [f for f in facts.values() if f.running and not f.reachable]
    if not silent:
        return
    from opsctl.base.errors import AUTH_HINT, TLS_HINT

    auth = [f.name for f in silent if is_auth_failure(f.error)]
    handshake = [f.name for f in silent if tls or is_tls_failure(f.error)]
    detail = "\n".join(f"{f.name}: {f.error or 'no answer'}" for f in silent)
    if auth:
        raise OpsctlError(f"authentication failed for {', '.join(auth)}", detail, AUTH_HINT)
    if handshake:
        raise OpsctlError(f"no TLS answer from {', '.join(handshake)}", detail, TLS_HINT)
    raise OpsctlError(f"{len(silent)} node(s) run but do not answer", detail,
                      "look at their logs (a LOADING node answers once its data is loaded); "
                      "`opsctl status` shows every node")


def ephemeral_port_warning(loaded: LoadedSpec, first: int, last: int) -> str | None:
    """A warning naming the nodes that listen inside [first, last], the range outgoing connections take their
    source port from: such a connection (a client, another node's cluster bus) can hold the port when the node
    restarts and binds it, and the node then fails to start with "Address already in use"."""
    clashing = [f"{node.name} ({', '.join(str(p) for p in inside)})" for node in loaded.layout.nodes
                if (inside := [p for p in _bound(loaded, node) if first <= p <= last])]
    if not clashing:
        return None
    more = f" and {len(clashing) - 3} more" if len(clashing) > 3 else ""
    verb = "listens" if len(clashing) == 1 else "listen"
    return (f"{', '.join(clashing[:3])}{more} {verb} inside this machine's ephemeral port range {first}-{last} "
            "(net.ipv4.ip_local_port_range): an outgoing connection can hold such a port when the node restarts "
            f"and binds it; pick ports below the range{_offsets_note(loaded)}")


def _bound(loaded: LoadedSpec, node: Node) -> list[int]:
    """The ports bound for node: its own (listen_ports) and, with metrics.exporter, its exporter's."""
    spec = loaded.spec
    return listen_ports(spec, node) + ([exporter_port(node, spec.metrics.port_offset)] if spec.metrics.exporter else [])


def _offsets_note(loaded: LoadedSpec) -> str:
    spec = loaded.spec
    notes = [f"cluster bus ports are port + {spec.cluster_or_default().bus_port_offset} (cluster.bus_port_offset)"
             ] if spec.topology == "cluster" else []
    if spec.metrics.exporter:
        notes.append(f"exporter ports port + {spec.metrics.port_offset} (metrics.port_offset)")
    return f" ({', '.join(notes)})" if notes else ""
