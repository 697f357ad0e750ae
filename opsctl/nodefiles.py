"""Node files on disk: default per-node paths, private (0600) writes, and `opsctl render -o DIR`."""

from __future__ import annotations

import os
from pathlib import Path

from opsctl.render import NodePaths, render_node
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec


def default_paths(root: str, node: Node) -> NodePaths:
    base = f"{root}/{node.name}"
    conf = "sentinel.conf" if node.is_sentinel else "redis.conf"
    return NodePaths(dir=base, conf=f"{base}/{conf}", acl=f"{base}/users.acl", log=f"{base}/server.log",
                     pid=f"{base}/server.pid")


def write_private(path: Path, text: str) -> None:
    """Create or replace path with mode 0600 from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_rendered(loaded: LoadedSpec, output: Path, show_secrets: bool, stdout: bool) -> list[str]:
    """Render every node. To a directory: real secrets, 0600 files. To stdout: masked unless show_secrets."""
    lines: list[str] = []
    root = str(output.resolve()) if not stdout else "/var/lib/opsctl/" + loaded.spec.name
    for node in loaded.layout.nodes:
        rendered = render_node(loaded, node, default_paths(root, node), reveal=show_secrets or not stdout)
        for name, text in rendered.files.items():
            if stdout:
                lines += [f"### {node.name}/{name}", text]
            else:
                target = output / node.name / name
                write_private(target, text)
                lines.append(f"wrote {target}")
    return lines
