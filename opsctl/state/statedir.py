"""Where a spec's local state lives (journal, locks, generated TLS files), checked before anything is done."""

from __future__ import annotations

from pathlib import Path

from opsctl.spec.load import LoadedSpec

STATE_FOLDER = ".opsctl"  # beside the spec: `<folder of the spec>/.opsctl/<name>` unless --state-dir says otherwise


def state_dir_for(loaded: LoadedSpec, explicit: str | None) -> Path:
    """The state dir, checked before anything is done: the folders opsctl makes in it (`.opsctl/<name>`, or the
    last part of --state-dir) must not be links, files, or owned by someone else. Never resolved through a link."""
    from opsctl.state.safefs import check_state_path

    if explicit:
        typed = Path(explicit).absolute()
        if not typed.name or typed.name in (".", ".."):
            typed = typed.resolve()
        path = typed.parent.resolve() / typed.name
        check_state_path(path, below=path.parent)
        return path
    spec_folder = Path(loaded.file).resolve().parent
    path = spec_folder / STATE_FOLDER / loaded.spec.name
    check_state_path(path, below=spec_folder)
    return path


