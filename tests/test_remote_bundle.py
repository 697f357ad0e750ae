"""deploy.yml's archives (opsctl/remote/bundle.py): members, owners, modes, written-once files, byte-stable
output, and GNU tar's own compare finding nothing to change after an extract (what makes a second deploy a
no-op)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from opsctl.errors import OpsctlError
from opsctl.remote.bundle import archive, host_archives, host_members, node_members, settings_text
from opsctl.remote.inventory import remote_root
from opsctl.remote.staging import stage
from opsctl.specfile import read_spec
from tests.support import make_spec, write_spec


def loaded_spec(tmp_path: Path, topology: str = "sentinel", binary: str | None = None):
    spec = make_spec(topology)
    spec["provider"] = "ansible"
    if binary:
        spec["server"]["binary"] = binary
    tmp_path.mkdir(parents=True, exist_ok=True)
    return read_spec(write_spec(tmp_path, spec))


def members_of(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_node_archive_holds_folder_settings_and_files_but_not_sentinel_conf(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path)
    spec, layout = loaded.spec, loaded.layout
    server, sentinel = layout.servers[0], layout.sentinels[0]
    root = remote_root(spec).lstrip("/")
    got = members_of(archive(node_members(spec, server, {"redis.conf": "port 1\n", "opsctl-node.json": "{}"})))
    folder = f"{root}/{server.name}"
    assert set(got) == {folder, f"{root}/nodes/{server.name}.env", f"{folder}/redis.conf",
                        f"{folder}/opsctl-node.json"}
    assert got[folder].isdir() and got[folder].mode == 0o700 and got[folder].uname == spec.server.flavor
    conf = got[f"{folder}/redis.conf"]
    assert (conf.mode, conf.uname, conf.gname, conf.mtime) == (0o600, spec.server.flavor, spec.server.flavor, 0)
    settings = got[f"{root}/nodes/{server.name}.env"]
    assert (settings.mode, settings.uname, settings.gname) == (0o600, "root", "root")
    assert "sentinel.conf" not in " ".join(members_of(archive(node_members(spec, sentinel, {"sentinel.conf": "x"}))))
    text = settings_text(spec, sentinel)
    assert "OPSCTL_ARGS=--sentinel" in text and f"OPSCTL_PORT={sentinel.port}" in text
    assert "OPSCTL_BIN=/usr/bin/valkey-server" in text


def test_host_archive_ships_a_given_binary_and_the_script(tmp_path: Path) -> None:
    binary = tmp_path / "valkey-server"
    binary.write_bytes(b"\x7fELF")
    spec = loaded_spec(tmp_path, "cluster", str(binary)).spec
    root = remote_root(spec).lstrip("/")
    got = members_of(archive(host_members(spec, b"#!/bin/sh\n", b"\x7fELF")))
    assert got[f"{root}/bin/valkey-server"].mode == 0o750 and got[f"{root}/bin/valkey-server"].gname == "valkey"
    assert got[f"{root}/bin/opsctl-node"].mode == 0o700 and got[f"{root}/nodes"].mode == 0o700
    assert got[root].mode == 0o750 and got[root.rsplit("/", 1)[0]].mode == 0o755
    assert f"{root}/bin/valkey-server" not in members_of(archive(host_members(loaded_spec(
        tmp_path / "b").spec, b"#!/bin/sh\n", None)))


def test_archives_are_byte_stable_and_refuse_odd_file_names(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path, "cluster")
    files = {n.name: {"redis.conf": f"port {n.port}\n"} for n in loaded.layout.nodes}
    first = host_archives(loaded.spec, loaded.layout.nodes, files, b"script", None)
    assert first == host_archives(loaded.spec, loaded.layout.nodes, files, b"script", None)
    hosts = {n.host for n in loaded.layout.nodes}
    assert set(first) == {f"host-{h}.tar" for h in hosts} | {f"base-{h}.tar" for h in hosts} | {
        f"node-{n.name}.tar" for n in loaded.layout.nodes}
    host = loaded.layout.servers[0].host
    on_host = {n.name for n in loaded.layout.nodes if n.host == host}
    names = set(members_of(first[f"host-{host}.tar"]))
    assert {name for name in names if name.endswith(".env")} == {
        f"{remote_root(loaded.spec).lstrip('/')}/nodes/{n}.env" for n in on_host}
    with pytest.raises(OpsctlError, match="refusing file name"):
        node_members(loaded.spec, loaded.layout.servers[0], {"../x": "boom"})


@pytest.mark.skipif(not shutil.which("tar"), reason="GNU tar is needed")
def test_gnu_tar_finds_nothing_to_change_after_an_extract(tmp_path: Path) -> None:
    """What unarchive runs: extract, then `tar --diff` on the next deploy. A server writing into its folder
    (new files, the folder's mtime) is no difference; a changed file is."""
    loaded = loaded_spec(tmp_path / "spec", "cluster")
    node = loaded.layout.servers[0]
    stage(loaded, tmp_path / "files", {node.name: {"redis.conf": "port 1\n"}})
    bundle, dest = tmp_path / "files" / f"node-{node.name}.tar", tmp_path / "dest"
    dest.mkdir()
    subprocess.run(["tar", "--extract", "-C", str(dest), "-f", str(bundle)], check=True)
    folder = dest / remote_root(loaded.spec).lstrip("/") / node.name
    (folder / "dump.rdb").write_bytes(b"data")
    diff = subprocess.run(["tar", "--diff", "-C", str(dest), "-f", str(bundle)], capture_output=True, text=True,
                          check=False)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    (folder / "redis.conf").write_text("port 2\n")
    diff = subprocess.run(["tar", "--diff", "-C", str(dest), "-f", str(bundle)], capture_output=True, text=True,
                          check=False)
    assert "Contents differ" in diff.stdout
    assert oct(bundle.stat().st_mode & 0o777) == "0o600"
