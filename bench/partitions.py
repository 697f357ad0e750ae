"""bench/partitions: acknowledged writes lost when a Sentinel master's host is cut off, per server and setting.

    .venv/bin/python bench/partitions.py [--flavor valkey|redis|both] [--runs N] [--cut SECONDS] [--seed S]

Each run is tests/partition.py's sentinel-split in a fresh network namespace (root, ip and iptables needed): a
Sentinel topology (3 sentinels, master + 2 replicas, down-after 2 s) deployed by opsctl, the master's host cut off
from the two others for --cut seconds while a client beside it writes, healed, the old master rejoined, the
acknowledged writes missing from the new master counted. Settings: opsctl's default (min-replicas-to-write 1,
min-replicas-max-lag 5), a tighter lag (1 / 2) and the opt-out (0). One table row per server and setting: the
closing-note table of issue 23 (docs/runbooks/partitions.md quotes it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.partition import SplitResult, run_in_namespace, unavailable

SETTINGS = {"default (1, 5 s)": (None, None), "lag 2 s (1, 2 s)": (None, 2), "opt-out (0)": (0, None)}


def _span(values: list[float]) -> str:
    return f"{min(values):.1f}" if min(values) == max(values) else f"{min(values):.1f}-{max(values):.1f}"


def row(flavor: str, setting: str, results: list[SplitResult]) -> str:
    lost = [r.lost for r in results]
    bound = "lag + 2 s" if results[0].to_write != "0" else "Sentinel converting the old master after the heal"
    return (f"| Sentinel master's host cut {results[0].cut:.0f} s | {flavor} | {setting} | {len(results)} | "
            f"{min(lost)}-{max(lost)} of {min(r.acked for r in results)}+ | "
            f"{_span([r.loss_window for r in results])} ({bound}) | {_span([r.two_masters for r in results])} | "
            f"{_span([r.rejoined - r.cut for r in results])} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavor", default="both", choices=["valkey", "redis", "both"])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cut", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args()
    if (lacking := unavailable()) is not None:
        print(f"needs {lacking}", file=sys.stderr)
        return 2
    flavors = ["valkey", "redis"] if args.flavor == "both" else [args.flavor]
    print("| fault | server | min-replicas (to-write, lag) | runs | acknowledged writes lost | loss window s "
          "(what bounds it) | two writable masters s | rejoined s after the heal |")
    print("|---|---|---|---|---|---|---|---|")
    for flavor in flavors:
        for setting, (to_write, lag) in SETTINGS.items():
            results = [SplitResult(**run_in_namespace("sentinel-split", flavor=flavor, seed=args.seed + i,
                                                      cut=args.cut, to_write=to_write, lag=lag))
                       for i in range(args.runs)]
            print(row(flavor, setting, results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
