"""opsctl's own signals on disk: one node_exporter textfile per topology and command, replaced atomically.

The folder is node_exporter's --collector.textfile.directory and must exist: opsctl never creates it (a folder it
made would be 0700, closed to node_exporter). The file is 0644 for the same reason; its temp name ends in .tmp,
which the collector skips, so a scrape sees the old file or the new one, never half of one.
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
