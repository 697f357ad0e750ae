"""Node files on disk: default per-node paths, private (0600) writes, and `opsctl render --dir DIR`."""

from __future__ import annotations

from pathlib import Path

from opsctl.render import default_paths, render_node
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import LINK_HINT, FileProblem, make_dir, trusted_owners, write_private

__all__ = ["write_rendered"]


def write_rendered(loaded: LoadedSpec, output: Path, show_secrets: bool, stdout: bool) -> list[str]:
    """Render every node. To a directory: real secrets, 0600 files in 0700 folders (the output folder too when
    opsctl creates it). To stdout: masked unless show_secrets."""
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
