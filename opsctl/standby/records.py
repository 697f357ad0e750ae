"""What a standby's state dir records about it: `standby.json`, written by a switchover (when, from which primary,
planned or with the primary lost, the recovery point): a switched-over standby whose spec still says `follows:` is
refused by plan and apply, so an apply never fences a promoted site again; and `standby-lag.json`, the running
link's last lag report, which `status` shows (docs/standby.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import read_bounded, write_private

RECORD = "standby.json"
LAG = "standby-lag.json"
LAG_EVERY = 2.0  # seconds between two lag files written (the link reports twice a second)
STALE = 30.0  # a lag report older than this: the link does not run
HINT = "it is opsctl's record of a switchover: restore it from a backup of the state dir, or remove it only if " \
       "no switchover happened"


@dataclass(frozen=True)
class Switched:
    """A switchover done: at (epoch seconds), from the primary shown, planned or with the primary lost; recovery:
    per source shard the last applied offset and its time (--primary-lost)."""

    at: float
    primary: str
    mode: str  # planned | primary-lost
    recovery: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"switched_over_at": self.at, "primary": self.primary, "mode": self.mode,
                           "recovery": self.recovery}, indent=1)


def parse_switched(text: str, where: str) -> Switched:
    try:
        data = json.loads(text)
        mode = str(data["mode"])
        if mode not in ("planned", "primary-lost"):
            raise ValueError(mode)
        recovery = {str(k): {str(f): float(v) for f, v in dict(r).items()} for k, r in
                    dict(data.get("recovery") or {}).items()}
        return Switched(float(data["switched_over_at"]), str(data["primary"]), mode, recovery)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise OpsctlError(f"{where}: not a standby record ({type(exc).__name__})", hint=HINT) from None


def read_switched(state_dir: Path) -> Switched | None:
    path = state_dir / RECORD
    text = read_bounded(path, HINT)
    return None if text is None else parse_switched(text, str(path))


def record_switched(state_dir: Path, switched: Switched) -> None:
    write_private(state_dir / RECORD, switched.to_json())


def check_declared(loaded: LoadedSpec, state_dir: Path, applying: bool = False) -> str | None:
    """Before plan and apply: refused when the standby was switched over but its spec still says follows: (its
    apply would fence the site that now takes writes); else a line saying the spec is a standby (None: it is not).
    applying: an apply of a spec without follows: acknowledges a switchover, and its record goes (the site may
    become a standby again later, of the other one: the way back)."""
    follows = loaded.spec.follows
    switched = read_switched(state_dir)
    if follows is None:
        if switched is not None and applying:
            (state_dir / RECORD).unlink(missing_ok=True)
        return None
    if switched is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(switched.at))
        raise RefusedError(f"'{loaded.spec.name}' was switched over ({switched.mode}, {when}) and takes writes now, "
                           "but its spec still says follows:",
                           "an apply would fence its servers against the writes they take",
                           "remove follows: from the spec (the way back: move follows: into the old primary's spec; "
                           "docs/standby.md)")
    primary = follows.spec or ", ".join(follows.endpoints or [])
    return (f"'{loaded.spec.name}' is a standby of {primary}: its clients' writes are refused (NOPERM) while "
            "`opsctl follow` streams the primary's writes into it, until `opsctl switchover`")


def lag_json(at: float, primary: str, shards: Mapping[str, Mapping[str, object]]) -> str:
    rows = {k: {f: v for f, v in r.items() if f in ("phase", "lag_bytes", "lag_seconds", "applied", "copied")}
            for k, r in shards.items()}
    return json.dumps({"at": at, "primary": primary, "shards": rows})


def read_lag(state_dir: Path) -> tuple[float, dict[str, dict[str, float | str]]] | None:
    """The link's last report: (when, per source shard its phase and lag); None: none, or not one (a file read back
    is checked: a wrong one is no report, status says so)."""
    text = read_bounded(state_dir / LAG, f"remove {state_dir / LAG}: the running link writes it anew")
    if text is None:
        return None
    try:
        data = json.loads(text)
        shards = {str(k): {str(f): v if isinstance(v, str) else float(v) for f, v in dict(r).items()}
                  for k, r in dict(data["shards"]).items()}
        return float(data["at"]), shards
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def following_line(loaded: LoadedSpec, state_dir: Path, now: float) -> str | None:
    """status's line about a standby: switched over, following (lag per shard, bytes and seconds), or not following
    (no report, or one older than STALE); None for a spec without follows: that was never switched over."""
    switched = read_switched(state_dir)
    if switched is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(switched.at))
        return f"standby switched over from {switched.primary} ({switched.mode}, {when}): it takes writes"
    if loaded.spec.follows is None:
        return None
    primary = loaded.spec.follows.spec or ", ".join(loaded.spec.follows.endpoints or [])
    lag = read_lag(state_dir)
    if lag is None or now - lag[0] > STALE:
        since = "" if lag is None else f", last report {now - lag[0]:.0f}s ago"
        return f"standby of {primary}: not following{since} (opsctl follow -f {loaded.file})"
    rows = [f"{k} {r.get('phase')}{_progress(r)}" for k, r in sorted(lag[1].items())]
    return f"standby of {primary}: following, {', '.join(rows)} ({now - lag[0]:.1f}s ago)"


def _progress(row: Mapping[str, object]) -> str:
    """A shard's progress after its phase: stream: its lag (-1: its primary did not answer, a split: unknown, never
    a lag); attach (the link lost: a failover, a restart, a split): nothing to count (no copy again); snapshot: the
    keys copied."""
    phase = row.get("phase")
    if phase == "stream":
        lag_bytes = int(float(str(row.get("lag_bytes", -1))))
        if lag_bytes < 0:
            return " lag unknown (the primary does not answer)"
        return f" lag {lag_bytes}B {float(str(row.get('lag_seconds', 0))):.2f}s"
    if phase == "attach":
        return " (link lost: attaching again from the journaled offset, no copy)"
    return f" {int(float(str(row.get('copied', 0))))} keys copied"
