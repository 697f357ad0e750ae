"""opsctl's own run signals for node_exporter's textfile collector: what a run of a recorded command says (its
outcome, the last success carried over from the file before), rendered as Prometheus text (pure); and on disk: one
textfile per topology and command, replaced atomically (its temp name ends in .tmp, which the collector skips), so a
scrape never sees half of one. The folder must exist and the file is 0644: node_exporter, another user, reads both.
More: docs/internals.md."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from opsctl.base.frozen import Frozen, frozen
from opsctl.state.safefs import FileProblem, read_bounded, write_private

RECORDED_COMMANDS = ("apply", "backup", "restore", "failover", "cluster reshard", "cluster rebalance", "cluster fix")

RunOutcome = Literal["ok", "error", "refused"]

OUTCOMES: tuple[RunOutcome, ...] = ("ok", "error", "refused")

METRIC_HELP = {
    "opsctl_last_run_timestamp_seconds": "When the last run of this opsctl command on this topology ended (unix time).",
    "opsctl_last_run_duration_seconds": "How long the last run of this opsctl command took.",
    "opsctl_last_run_outcome": "1 for the outcome of the last run (ok, error, refused), 0 for the others.",
    "opsctl_last_success_timestamp_seconds": "When the last successful run ended (unix time); 0: none yet.",
    "opsctl_last_run_keys_moved": "Keys the last run moved, backed up or restored.",
    "opsctl_slot_load_share": "A hot slot's share of its cluster's measured load (audit --hot: top N per master).",
    "opsctl_standby_following": "1 while the standby's link (opsctl follow) runs, 0 once it stopped; the file's age "
                                "(node_textfile_mtime_seconds) tells a killed one.",
    "opsctl_standby_lag_bytes": "Bytes of the source shard's replication stream the standby has not applied yet "
                                "(-1: the source shard did not answer).",
    "opsctl_standby_lag_seconds": "Seconds since the oldest source write the standby has not applied yet arrived.",
    "opsctl_standby_link_up": "1 while the source shard's link streams, 0 while it is lost and attached again "
                              "(a cut, a failover); a copying shard has no sample.",
    "opsctl_standby_last_applied_timestamp_seconds": "When the newest write the standby applied was read from the "
                                                     "source shard (unix time; 0: none yet, still copying).",
}
HOT_COMMAND = "audit hot"  # the textfile of `audit --hot --metrics-textfile`: the hottest slots per master
FOLLOW_COMMAND = "follow"  # the textfile of `follow --metrics-textfile`: the standby link's lag, while it runs

_SUCCESS_LINE = re.compile(r"^opsctl_last_success_timestamp_seconds(?:\{[^}]*\})?\s+(\S+)\s*$", re.MULTILINE)

@frozen
class RunSignal(Frozen):
    """One finished opsctl run as its textfile reports it: finished and duration in seconds (unix time, elapsed);
    keys_moved None when the command moves no keys."""

    command: str
    topology: str
    finished: float
    duration: float
    outcome: RunOutcome
    keys_moved: int | None = None

def outcome_of(exit_code: int) -> RunOutcome:
    """0 ok and 2 (it did its steps; more are left to plan) are ok, 3 a safety refusal, anything else an error."""
    return "ok" if exit_code in (0, 2) else "refused" if exit_code == 3 else "error"

def textfile_name(topology: str, command: str) -> str:
    """One file per topology and command (node_exporter reads *.prom only), so runs never overwrite each other."""
    return f"opsctl_{_slug(topology)}_{_slug(command)}.prom"

def last_success_in(previous: str | None) -> float | None:
    """The last success time a previous textfile recorded (None: no file, no success line, or not a number)."""
    match = _SUCCESS_LINE.search(previous or "")
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return value if value == value and value >= 0 else None  # value == value: not NaN

def render_textfile(run: RunSignal, previous: str | None = None) -> str:
    """The run's textfile; the last success time is the run's own when it succeeded, else the previous file's
    (0 when there was none), so a failed run never hides how old the last good one is."""
    labels = {"command": run.command, "topology": run.topology}
    success = run.finished if run.outcome == "ok" else (last_success_in(previous) or 0.0)
    samples: list[tuple[str, dict[str, str], str]] = [
        ("opsctl_last_run_timestamp_seconds", labels, _number(run.finished)),
        ("opsctl_last_run_duration_seconds", labels, _number(run.duration)),
        *[("opsctl_last_run_outcome", {**labels, "outcome": o}, "1" if o == run.outcome else "0") for o in OUTCOMES],
        ("opsctl_last_success_timestamp_seconds", labels, _number(success)),
    ]
    if run.keys_moved is not None:
        samples.append(("opsctl_last_run_keys_moved", labels, str(run.keys_moved)))
    return _exposition(samples)

def render_hot_slots(topology: str, report: dict[str, object]) -> str:
    """audit --hot's report (audit.hot.hot_report) as samples: each master's top slots, by the share of the load."""
    by = str(report["by"])
    masters = report["masters"]
    samples = [("opsctl_slot_load_share", {"topology": topology, "master": str(m["master"]), "slot": str(s["slot"]),
                                           "by": by}, f"{float(s['share']):.6f}")
               for m in (masters if isinstance(masters, list) else []) for s in m["slots"]]
    return _exposition(samples) if samples else ""


def render_follow(standby: str, shards: Mapping[str, Mapping[str, object]], following: bool) -> str:
    """A standby link's textfile: following, and per source shard (a MigrateLag's rows) whether its link is up once
    its copy is done, the lag while it streams and when its newest applied write was read (a copying shard has no
    lag yet: no sample, rather than a false 0)."""
    labels = {"topology": standby}
    samples: list[tuple[str, dict[str, str], str]] = [("opsctl_standby_following", labels, "1" if following else "0")]
    streaming = {key: row for key, row in sorted(shards.items()) if row.get("phase") == "stream"}
    # a lost link has no lag to report (no write arrives through it): its own 0 is what an alert can see
    samples += [("opsctl_standby_link_up", {**labels, "shard": key}, "1" if row["phase"] == "stream" else "0")
                for key, row in sorted(shards.items()) if row.get("phase") in ("stream", "attach")]
    for name, field in (("opsctl_standby_lag_bytes", "lag_bytes"), ("opsctl_standby_lag_seconds", "lag_seconds")):
        samples += [(name, {**labels, "shard": key}, _number(_float(row[field])))
                    for key, row in streaming.items() if field in row]
    samples += [("opsctl_standby_last_applied_timestamp_seconds", {**labels, "shard": key},
                 _number(_float(row.get("applied_at", 0.0)))) for key, row in sorted(shards.items())]
    return _exposition(samples)


def write_follow_textfile(folder: Path, standby: str, shards: Mapping[str, Mapping[str, object]],
                          following: bool) -> Path:
    """Replace the standby link's textfile (atomically, never through a link)."""
    return _replace(folder, textfile_name(standby, FOLLOW_COMMAND), render_follow(standby, shards, following))


def write_hot_textfile(folder: Path, topology: str, report: dict[str, object]) -> Path:
    """Replace the topology's hot-slot textfile (a run that finds no load leaves an empty one: no stale slots)."""
    return _replace(folder, textfile_name(topology, HOT_COMMAND), render_hot_slots(topology, report))


def _replace(folder: Path, name: str, text: str) -> Path:
    """folder/name replaced by text, readable by node_exporter (0644); a link there, or what is not a textfile,
    refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileProblem(folder, "does not exist or is not a folder", HINT)
    path = folder / name
    read_bounded(path, f"remove {path}: opsctl writes it anew ({HINT})")  # refuses a link or an oversized file
    write_private(path, text, mode=0o644)
    return path


def _exposition(samples: list[tuple[str, dict[str, str], str]]) -> str:
    lines: list[str] = []
    for name, labels, value in samples:
        if not lines or not lines[-1].startswith(f"{name}{{"):
            lines += [f"# HELP {name} {METRIC_HELP[name]}", f"# TYPE {name} gauge"]
        pairs = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
        lines.append(f"{name}{{{pairs}}} {value}")
    return "\n".join(lines) + "\n"

def _escape(value: str) -> str:
    """A label value in the text exposition format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

def _number(value: float) -> str:
    return f"{value:.3f}"


def _float(value: object) -> float:
    """A lag row's number (int or float; anything else, NaN included, is -1: unknown)."""
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else -1.0
    return number if number == number else -1.0

def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "_", text.lower()).strip("_") or "_"


HINT = "give --metrics-textfile the folder node_exporter reads (--collector.textfile.directory)"


def write_textfile(folder: Path, run: RunSignal) -> Path:
    """Write the run's textfile into folder, carrying the last success time forward from the file it replaces."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileProblem(folder, "does not exist or is not a folder", HINT)
    path = folder / textfile_name(run.topology, run.command)
    previous = read_bounded(path, f"remove {path}: opsctl writes it anew ({HINT})")
    write_private(path, render_textfile(run, previous), mode=0o644)
    return path


def topology_textfiles(folder: Path, topology: str) -> list[Path]:
    """The topology's textfiles in folder, by their exact names (never a pattern: another topology's name may start
    with this one's), links included (removed themselves, never followed)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileProblem(folder, "does not exist or is not a folder", HINT)
    paths = [folder / textfile_name(topology, command) for command in (*RECORDED_COMMANDS, HOT_COMMAND, FOLLOW_COMMAND)]
    return [p for p in paths if p.is_symlink() or p.is_file()]


def remove_textfiles(folder: Path, topology: str) -> list[Path]:
    """Delete the topology's textfiles (destroy --purge): a purged topology's old runs would keep its alerts firing
    (OpsctlBackupMissing, 26 h after its last backup). Returns what went."""
    gone = topology_textfiles(folder, topology)
    for path in gone:
        path.unlink()
    return gone
