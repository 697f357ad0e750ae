"""The rollout journal: which wave a staged rollout is in, which topologies it started and finished, and a gate
that failed, in the fleet's state folder (<DIR>/.opsctl/fleet-rollout.json), written through the safe-file helpers
and validated when read back. A run killed mid-way reads it to finish what it started; a failed gate stays there, so
the same command starts nothing it stopped until --resume says the cause is dealt with."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from opsctl.base.errors import OpsctlError

VERSION = 1
NAME = "fleet-rollout.json"
LOCK = "fleet-rollout.lock"  # held for a whole rollout (opsctl.state.statelock.named_lock)


@dataclass(frozen=True)
class Journal:
    """key: the rollout's identity (its waves and each topology's spec digest): a changed spec is a new rollout.
    waves: the names of each wave. started, done: topologies whose apply began, ended converged. halted: why the
    rollout stopped (a topology that failed or a gate), with the wave it stopped in."""

    key: str
    waves: tuple[tuple[str, ...], ...]
    started: tuple[str, ...] = ()
    done: tuple[str, ...] = ()
    halted: str | None = None
    halted_wave: int | None = None
    gated: tuple[int, ...] = field(default=())

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "key": self.key, "waves": [list(w) for w in self.waves],
                           "started": list(self.started), "done": list(self.done), "halted": self.halted,
                           "halted_wave": self.halted_wave, "gated": list(self.gated)}, indent=2) + "\n"

    def starting(self, names: tuple[str, ...]) -> Journal:
        return replace(self, started=tuple(dict.fromkeys((*self.started, *names))))

    def finished(self, name: str) -> Journal:
        return replace(self, done=tuple(dict.fromkeys((*self.done, name))))

    def gate_passed(self, wave: int) -> Journal:
        return replace(self, gated=tuple(sorted({*self.gated, wave})))

    def halt(self, wave: int, why: str) -> Journal:
        return replace(self, halted=why, halted_wave=wave)


def state_folder(folder: Path) -> Path:
    """The fleet's own state: its rollout journal and lock, beside the topologies' state folders."""
    return folder / ".opsctl"


def journal_path(folder: Path) -> Path:
    return state_folder(folder) / NAME


def write_journal(folder: Path, journal: Journal) -> None:
    from opsctl.state.safefs import write_private

    write_private(journal_path(folder), journal.to_json())


def forget_journal(folder: Path) -> None:
    journal_path(folder).unlink(missing_ok=True)


def read_journal(folder: Path) -> Journal | None:
    """The journal of folder's rollout, None when there is none; one that is not what opsctl writes is an error
    naming the file (remove it to start the rollout anew)."""
    path = journal_path(folder)
    if not path.exists():
        return None
    from opsctl.state.safefs import open_regular

    with open_regular(path, "the fleet's rollout journal") as (stream, _):
        text = stream.read().decode(errors="replace")
    try:
        return parse_journal(json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        raise OpsctlError(f"{path}: not a rollout journal opsctl can read ({exc})",
                          hint=f"remove {path} to start the rollout anew (each topology's own journal stays)"
                          ) from None


def parse_journal(data: object) -> Journal:
    """The journal from its JSON form, each field checked."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version') if isinstance(data, dict) else '?'}, not {VERSION}")
    halted, halted_wave = data["halted"], data["halted_wave"]
    if not (halted is None or isinstance(halted, str)) or not (halted_wave is None or isinstance(halted_wave, int)):
        raise ValueError("halted is not a reason and a wave")
    return Journal(_text(data["key"]), tuple(_names(w) for w in _list(data["waves"])), _names(data["started"]),
                   _names(data["done"]), halted, halted_wave, tuple(_int(i) for i in _list(data["gated"])))


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list")
    return value


def _names(value: object) -> tuple[str, ...]:
    return tuple(_text(v) for v in _list(value))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ValueError(f"{value!r} is not a number")
    return value
