"""opsctl restart: a rolling restart, shard by shard: replicas first, then each master after a failover."""

from __future__ import annotations

import argparse
import json
import sys

from opsctl.commands.lifecycle import _common, _confirm, _print_status, _printer, _runtime
from opsctl.errors import EXIT_OK, OpsctlError
from opsctl.report import plan_text


def cmd_restart(args: argparse.Namespace) -> int:
    from opsctl.executor import execute
    from opsctl.plan.planner import restart_plan
    from opsctl.runtime import gather_facts, refuse_silent_nodes, spec_digest

    with _runtime(args, locked=True) as rt:
        names = [n.name for n in rt.loaded.layout.nodes]
        selected = set(args.nodes.split(",")) if args.nodes else set(names)
        unknown = sorted(selected - set(names))
        if unknown:
            raise OpsctlError(f"no node named {', '.join(unknown)}", hint=f"nodes are: {', '.join(names)}")
        facts = gather_facts(rt, with_config=False)
        refuse_silent_nodes(facts)
        plan = restart_plan(rt.loaded, facts, selected, spec_digest(rt.loaded))
        print(plan_text(plan) if args.output == "text" else json.dumps(plan.to_dict(), indent=2))
        if not plan.empty:
            _confirm(args, f"Restart {len(selected)} node(s) of '{plan.spec_name}'?")
            timings = execute(rt, plan, _printer(args), allow_downtime=args.allow_downtime,
                              parallel_shards=args.parallel_shards,
                              wait_timeout=args.wait_timeout)
            print(f"Restarted in {sum(t for _, t in timings):.2f}s.", file=sys.stderr)
        _print_status(rt, args.output)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("restart", help="rolling restart: replicas first, masters after a graceful failover")
    _common(p)
    p.add_argument("--nodes", help="comma-separated node names (default: every node)")
    p.add_argument("--parallel-shards", type=int, default=1, metavar="N", help="restart N shards at once")
    p.add_argument("--wait-timeout", type=float, default=60.0, metavar="S",
                   help="how long a restarted node may take to be back in place, or a failover's checks to pass")
    p.add_argument("--auto-approve", action="store_true", help="do not ask for confirmation")
    p.add_argument("--allow-downtime", action="store_true", help="allow restarting a master that has no replica")
    p.set_defaults(handler=cmd_restart)
