"""opsctl's own signals on disk: one node_exporter textfile per topology and command, replaced atomically (its
temp name ends in .tmp, which the collector skips), so a scrape never sees half of one. The folder must exist and
the file is 0644: node_exporter, another user, reads both. More: docs/internals.md.
"""

from __future__ import annotations

from pathlib import Path

from opsctl.plan.metrics import RunSignal, render_textfile, textfile_name
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
