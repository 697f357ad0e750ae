"""What a standby's state dir records about it: `standby.json`, written by a switchover (when, from which primary,
planned or with the primary lost, the recovery point): a switched-over standby whose spec still says `follows:` is
refused by plan and apply, so an apply never fences a promoted site again; and `standby-lag.json`, the running
link's last lag report. What both say is status's StandbyStatus (docs/standby.md). Here, below status, so that
status reads them; opsctl.standby writes them."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.frozen import Frozen, frozen
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import read_bounded, write_private

RECORD = "standby.json"
LAG = "standby-lag.json"
LAG_EVERY = 2.0  # seconds between two lag files written (the link reports twice a second)
STALE = 30.0  # a lag report older than this: the link does not run
HINT = "it is opsctl's record of a switchover: restore it from a backup of the state dir, or remove it only if " \
       "no switchover happened"


@frozen
class Switched(Frozen):
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


@frozen
class ShardLink(Frozen):
    """One source shard's link in the last lag report. phase: snapshot (copying), stream, or attach (its link lost:
    attaching again from the journaled offset, no copy); lag_bytes and lag_seconds while it streams (None: unknown,
    its primary did not answer, or not streaming); copied: keys copied; applied: writes applied."""

    shard: str
    phase: str
    lag_bytes: int | None
    lag_seconds: float | None
    copied: int
    applied: int

    def as_dict(self) -> dict[str, str | int | float | None]:
        return dict(self.__dict__)

    def words(self) -> str:
        """status's words for it: stream: its lag (unknown: a split, never a lag); attach: nothing to count (no copy
        again); snapshot: the keys copied."""
        if self.phase == "stream":
            if self.lag_bytes is None or self.lag_seconds is None:
                return f"{self.shard} stream lag unknown (the primary does not answer)"
            return f"{self.shard} stream lag {self.lag_bytes}B {self.lag_seconds:.2f}s"
        if self.phase == "attach":
            return f"{self.shard} attach (link lost: attaching again from the journaled offset, no copy)"
        return f"{self.shard} {self.phase} {self.copied} keys copied"


PHASES = ("snapshot", "stream", "attach")


def _shard_link(shard: str, row: Mapping[str, object]) -> ShardLink:
    """A lag file's row, checked (ValueError: not one): the phase one of PHASES, the numbers numbers."""
    phase = row.get("phase")
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}")
    lag_bytes = int(_number(row, "lag_bytes", -1))
    streaming = phase == "stream" and lag_bytes >= 0  # -1: the primary did not answer the look at its offset
    return ShardLink(shard, str(phase), lag_bytes if streaming else None,
                     _number(row, "lag_seconds", 0.0) if streaming else None,
                     int(_number(row, "copied", 0)), int(_number(row, "applied", 0)))


def _number(row: Mapping[str, object], name: str, default: float) -> float:
    value = row.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(name)
    return float(value)


def read_lag(state_dir: Path) -> tuple[float, tuple[ShardLink, ...]] | None:
    """The link's last report: (when, each source shard's link); None: none, or not one (a file read back is
    checked: a wrong one is no report, status says not following)."""
    text = read_bounded(state_dir / LAG, f"remove {state_dir / LAG}: the running link writes it anew")
    if text is None:
        return None
    try:
        data = json.loads(text)
        rows = data["shards"]
        if not isinstance(rows, dict) or not rows:  # the link reports every source shard, one at least
            raise ValueError("shards")
        return _number(data, "at", -1.0), tuple(_shard_link(str(k), dict(r)) for k, r in sorted(rows.items()))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


@frozen
class StandbyStatus(Frozen):
    """status's word about a standby. state: switched-over, following or not-following; primary: the primary it
    follows (switched over: the one it was switched over from); switched over: mode (planned | primary-lost) and
    switched_at (unix time); following: shards, the last report's, and report_age (seconds); not following:
    report_age of the last report (None: none), hint: the command that starts the link."""

    state: str
    primary: str
    mode: str | None = None
    switched_at: float | None = None
    report_age: float | None = None
    shards: tuple[ShardLink, ...] = ()
    hint: str | None = None

    def line(self) -> str:
        if self.state == "switched-over":
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.switched_at or 0.0))
            return f"standby switched over from {self.primary} ({self.mode}, {when}): it takes writes"
        if self.state == "not-following":
            since = "" if self.report_age is None else f", last report {self.report_age:.0f}s ago"
            return f"standby of {self.primary}: not following{since} ({self.hint})"
        return (f"standby of {self.primary}: following, {', '.join(s.words() for s in self.shards)} "
                f"({self.report_age:.1f}s ago)")

    def to_dict(self) -> dict[str, object]:
        return {"state": self.state, "primary": self.primary, "mode": self.mode, "switched_at": self.switched_at,
                "report_age": None if self.report_age is None else round(self.report_age, 1),
                "shards": {s.shard: {k: v for k, v in s.as_dict().items() if k != "shard"} for s in self.shards},
                "hint": self.hint}


def standby_status(loaded: LoadedSpec, state_dir: Path, now: float) -> StandbyStatus | None:
    """What the state dir says of a standby: switched over, following (a report at most STALE seconds old) or not
    (no report, or an older one); None for a spec without follows: that was never switched over."""
    switched = read_switched(state_dir)
    if switched is not None:
        return StandbyStatus("switched-over", switched.primary, switched.mode, switched.at)
    if loaded.spec.follows is None:
        return None
    primary = loaded.spec.follows.spec or ", ".join(loaded.spec.follows.endpoints or [])
    lag = read_lag(state_dir)
    if lag is None or now - lag[0] > STALE:
        return StandbyStatus("not-following", primary, report_age=None if lag is None else now - lag[0],
                             hint=f"opsctl follow -f {loaded.file}")
    return StandbyStatus("following", primary, report_age=now - lag[0], shards=lag[1])
