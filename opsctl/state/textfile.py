"""opsctl's own signals on disk: one node_exporter textfile per topology and command, replaced atomically (its
temp name ends in .tmp, which the collector skips), so a scrape never sees half of one. The folder must exist and
the file is 0644: node_exporter, another user, reads both. More: docs/internals.md.
"""

from __future__ import annotations

from pathlib import Path

from opsctl.plan.metrics import RECORDED_COMMANDS, RunSignal, render_textfile, textfile_name
from opsctl.state.safefs import FileProblem, read_bounded, write_private

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
    paths = [folder / textfile_name(topology, command) for command in RECORDED_COMMANDS]
    return [p for p in paths if p.is_symlink() or p.is_file()]


def remove_textfiles(folder: Path, topology: str) -> list[Path]:
    """Delete the topology's textfiles (destroy --purge): a purged topology's old runs would keep its alerts firing
    (OpsctlBackupMissing, 26 h after its last backup). Returns what went."""
    gone = topology_textfiles(folder, topology)
    for path in gone:
        path.unlink()
    return gone
