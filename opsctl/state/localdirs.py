"""The folders opsctl makes for a spec on this machine: its state dir (journal, locks, generated TLS files), checked
before anything is done, and `opsctl render --dir DIR`'s node files (private 0600 writes in 0700 folders)."""

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


def write_rendered(loaded: LoadedSpec, output: Path, show_secrets: bool, stdout: bool) -> list[str]:
    """Render every node. To a directory: real secrets, 0600 files in 0700 folders (the output folder too when
    opsctl creates it). To stdout: masked unless show_secrets."""
    from opsctl.render import default_paths, render_node  # the renderer loads only for render: not on the audit's path
    from opsctl.state.safefs import LINK_HINT, FileProblem, make_dir, trusted_owners, write_private

    lines: list[str] = []
    root = str(output.absolute()) if not stdout else "/var/lib/opsctl/" + loaded.spec.name
    if not stdout:  # never written through a link (the folder named too), never a foreign folder; every target
        # checked before the first is written: a refusal at the last node leaves no half-written render
        for folder in (output, *(output / node.name for node in loaded.layout.nodes)):
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise FileProblem(folder, "is a symbolic link or not a folder", LINK_HINT)
        make_dir(Path(root), owners=trusted_owners(), enforce=False)
    for node in loaded.layout.nodes:
        if not stdout:
            make_dir(output / node.name, owners=trusted_owners())
        rendered = render_node(loaded, node, default_paths(root, node), reveal=show_secrets or not stdout)
        for name, text in rendered.files.items():
            if stdout:
                lines += [f"### {node.name}/{name}", text]
            else:
                target = output / node.name / name
                write_private(target, text)
                lines.append(f"wrote {target}")
    return lines
