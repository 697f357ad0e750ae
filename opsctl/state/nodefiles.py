"""Node files on disk: default per-node paths, private (0600) writes, and `opsctl render --dir DIR`."""

from __future__ import annotations

from pathlib import Path

from opsctl.render import default_paths, render_node
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import make_dir, trusted_owners, write_private

__all__ = ["write_rendered"]


def write_rendered(loaded: LoadedSpec, output: Path, show_secrets: bool, stdout: bool) -> list[str]:
    """Render every node. To a directory: real secrets, 0600 files in 0700 folders (the output folder too when
    opsctl creates it). To stdout: masked unless show_secrets."""
    lines: list[str] = []
    root = str(output.resolve()) if not stdout else "/var/lib/opsctl/" + loaded.spec.name
    if not stdout:  # the folder named on the command line may be a link (followed once), never a foreign folder
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
