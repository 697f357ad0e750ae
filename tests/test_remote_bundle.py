"""deploy.yml's installers (opsctl/providers/remote/bundle.py, playbooks/files/opsctl-install.sh): members, owners,
modes,
written-once files, byte-stable output, and the installer run by a real sh against a scratch root: a second run
changes nothing, a changed file is put back, sentinel.conf is written only when missing, `only` narrows it."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from opsctl import data_dir
from opsctl.base.errors import OpsctlError
from opsctl.providers.remote.bundle import (
    archive,
    host_installers,
    host_members,
    installer,
    node_members,
    settings_text,
    stage,
)
from opsctl.providers.remote.inventory import remote_root
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import make_spec, write_spec

EXISTING_USER = "daemon"  # user and group on Debian: the installer creates neither


def loaded_spec(tmp_path: Path, topology: str = "sentinel", binary: str | None = None,
                user: str | None = None) -> LoadedSpec:
    spec = make_spec(topology)
    spec["provider"] = "ansible"
    if binary:
        spec["server"]["binary"] = binary
    if user:
        spec["server"]["user"] = user
    tmp_path.mkdir(parents=True, exist_ok=True)
    return read_spec(write_spec(tmp_path, spec))


def members_of(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def parts_of(script: bytes) -> dict[str, bytes]:
    """The archives an installer carries, by name, read back through its own table."""
    text = script.decode("latin-1")
    table = text.split("PARTS='", 1)[1].split("'", 1)[0]
    size = int(text.split("PAYLOAD_BYTES=", 1)[1].split("\n", 1)[0])
    payload = script[len(script) - size:]
    rows = [line.split() for line in table.splitlines()]
    return {name: payload[int(offset):int(offset) + int(length)] for name, offset, length in rows}


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


def test_installers_are_byte_stable_one_per_host_and_refuse_odd_file_names(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path, "sentinel")
    body = (data_dir("playbooks") / "files" / "opsctl-install.sh").read_text()
    files = {n.name: {("sentinel.conf" if n.is_sentinel else "redis.conf"): f"port {n.port}\n"}
             for n in loaded.layout.nodes}
    first = host_installers(loaded.spec, loaded.layout.nodes, files, body, b"script", None)
    assert first == host_installers(loaded.spec, loaded.layout.nodes, files, body, b"script", None)
    hosts = sorted({n.host for n in loaded.layout.nodes})
    assert sorted(first) == [f"install-{h}.sh" for h in hosts]
    host = hosts[0]
    on_host = [n for n in loaded.layout.nodes if n.host == host]
    parts = parts_of(first[f"install-{host}.sh"])
    assert list(parts) == ["base", *(f"{kind}-{n.name}" for n in on_host
                                     for kind in (("node", "once") if n.is_sentinel else ("node",)))]
    sentinel = next(n for n in on_host if n.is_sentinel)
    once = members_of(parts[f"once-{sentinel.name}"])
    assert [m.name.rsplit("/", 1)[1] for m in once.values()] == ["sentinel.conf"]
    assert all((m.mode, m.uname) == (0o600, loaded.spec.server.service_user) for m in once.values())
    with pytest.raises(OpsctlError, match="refusing file name"):
        node_members(loaded.spec, loaded.layout.servers[0], {"../x": "boom"})
    with pytest.raises(ValueError, match="exit 0"):
        installer(body.replace("exit 0\n", ""), "valkey", "/var/lib/opsctl/x", [])


def run_installer(script: Path, root: Path, *args: str) -> list[str]:
    """The installer as deploy.yml runs it (sh, as root), into root instead of /: its `changed:` lines."""
    result = subprocess.run([str(script), "nostart", *args], capture_output=True, text=True, check=False,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OPSCTL_INSTALL_ROOT": str(root)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] in ("init: systemd", "init: other")
    return [line.removeprefix("changed: ") for line in result.stdout.splitlines() if line.startswith("changed: ")]


@pytest.mark.skipif(not shutil.which("tar") or not shutil.which("getent"), reason="GNU tar and getent are needed")
def test_installer_writes_once_then_changes_nothing_and_puts_back_what_differs(tmp_path: Path) -> None:
    """A server writing into its folder (new files, the folder's mtime) is no difference; a changed file is, and
    Sentinel's rewrite of sentinel.conf never is. `only` installs the named nodes of this host alone."""
    loaded = loaded_spec(tmp_path / "spec", "sentinel", user=EXISTING_USER)
    host = loaded.layout.sentinels[0].host
    server = next(n for n in loaded.layout.servers if n.host == host)
    sentinel = next(n for n in loaded.layout.sentinels if n.host == host)
    files = {server.name: {"redis.conf": "port 1\n"}, sentinel.name: {"sentinel.conf": "port 2\n"}}
    stage(loaded, tmp_path / "files", files)
    script = tmp_path / "files" / f"install-{host}.sh"
    assert oct(script.stat().st_mode & 0o777) == "0o600"
    script.chmod(0o700)  # what ansible.builtin.script does on the host
    dest = tmp_path / "dest"
    dest.mkdir()
    assert run_installer(script, dest, "only") == ["base"]
    assert run_installer(script, dest, "only", server.name, "another-hosts-node") == [f"node-{server.name}"]
    assert run_installer(script, dest, "all") == [f"node-{sentinel.name}", f"once-{sentinel.name}"]
    assert run_installer(script, dest, "all") == []
    root = dest / remote_root(loaded.spec).lstrip("/")
    (root / server.name / "dump.rdb").write_bytes(b"data")
    (root / sentinel.name / "sentinel.conf").write_text("port 2\nsentinel myid abc\n")  # what Sentinel learned
    assert run_installer(script, dest, "all") == []
    (root / server.name / "redis.conf").write_text("port 9\n")
    (root / server.name / "redis.conf").chmod(0o644)
    assert run_installer(script, dest, "all") == [f"node-{server.name}"]
    conf = root / server.name / "redis.conf"
    assert conf.read_text() == "port 1\n" and oct(conf.stat().st_mode & 0o777) == "0o600"
    assert conf.stat().st_uid == 1 and (root / "nodes").stat().st_uid == 0
    assert (root / sentinel.name / "sentinel.conf").read_text() == "port 2\nsentinel myid abc\n"
    (root / sentinel.name / "sentinel.conf").unlink()
    (root / sentinel.name / "sentinel.conf").symlink_to(tmp_path / "nowhere")
    assert run_installer(script, dest, "all") == [f"once-{sentinel.name}"]
    assert (root / sentinel.name / "sentinel.conf").read_text() == "port 2\n"
    assert not (tmp_path / "nowhere").exists()  # the dangling link was replaced, not followed


@pytest.mark.parametrize("args", [(), ("all",), ("start",), ("nostart", "some")])
def test_installer_refuses_a_call_without_start_or_nostart_then_all_or_only(tmp_path: Path,
                                                                             args: tuple[str, ...]) -> None:
    loaded = loaded_spec(tmp_path / "spec", "standalone", user=EXISTING_USER)
    stage(loaded, tmp_path / "files", {loaded.layout.nodes[0].name: {"redis.conf": "port 1\n"}})
    script = tmp_path / "files" / f"install-{loaded.layout.nodes[0].host}.sh"
    result = subprocess.run(["sh", str(script), *args], capture_output=True, text=True, check=False,
                            env={"PATH": "/usr/bin:/bin", "OPSCTL_INSTALL_ROOT": str(tmp_path / "nowhere")})
    assert result.returncode == 2 and "usage" in result.stderr and not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(Path("/run/systemd/system").is_dir(), reason="where systemd runs, deploy.yml starts the nodes")
def test_installer_starts_the_nodes_of_its_host_it_was_asked_for(tmp_path: Path) -> None:
    """`start` runs bin/opsctl-node start for each selected node of this host (a stand-in control script here),
    after installing; `nostart` starts none."""
    loaded = loaded_spec(tmp_path / "spec", "cluster", user=EXISTING_USER)
    host = loaded.layout.nodes[0].host
    mine = [n.name for n in loaded.layout.nodes if n.host == host]
    body = (data_dir("playbooks") / "files" / "opsctl-install.sh").read_text()
    control = b'#!/bin/sh\necho "started 42 $1 $2"\n'
    files = {n.name: {"redis.conf": "port 1\n"} for n in loaded.layout.nodes}
    script = tmp_path / "install.sh"
    script.write_bytes(host_installers(loaded.spec, loaded.layout.nodes, files, body, control, None)[
        f"install-{host}.sh"])
    script.chmod(0o700)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OPSCTL_INSTALL_ROOT": str(tmp_path / "dest")}
    (tmp_path / "dest").mkdir()

    def started(*args: str) -> list[str]:
        result = subprocess.run([str(script), *args], capture_output=True, text=True, check=False, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        return [line for line in result.stdout.splitlines() if line.startswith("started")]

    assert started("nostart", "all") == []
    assert started("start", "all") == [f"started 42 start {name}" for name in mine]
    assert started("start", "only", mine[-1], "another-hosts-node") == [f"started 42 start {mine[-1]}"]


@pytest.mark.skipif(not shutil.which("tar") or not shutil.which("getent"), reason="GNU tar and getent are needed")
def test_installer_check_mode_names_what_would_change_and_changes_nothing(tmp_path: Path) -> None:
    """`check` (Ansible's --check): `would change: WHAT` for each archive the host differs from, tar's line naming
    the differing file below it (never its content: the files hold passwords), and nothing written."""
    loaded = loaded_spec(tmp_path / "spec", "standalone", user=EXISTING_USER)
    node = loaded.layout.nodes[0]
    stage(loaded, tmp_path / "files", {node.name: {"redis.conf": "port 1\nrequirepass s3cret\n"}})
    script = tmp_path / "files" / f"install-{node.host}.sh"
    script.chmod(0o700)
    dest = tmp_path / "dest"
    dest.mkdir()

    def check() -> list[str]:
        result = subprocess.run([str(script), "check", "all"], capture_output=True, text=True, check=False,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OPSCTL_INSTALL_ROOT": str(dest)})
        assert result.returncode == 0 and "s3cret" not in result.stdout, result.stdout + result.stderr
        return [line for line in result.stdout.splitlines() if not line.startswith("init: ")]

    fresh = check()
    would = [line for line in fresh if line.startswith("would change:")]
    assert would == ["would change: base", f"would change: node-{node.name}"], fresh
    assert list(dest.iterdir()) == []
    run_installer(script, dest, "all")
    assert check() == []
    conf = dest / remote_root(loaded.spec).lstrip("/") / node.name / "redis.conf"
    conf.write_text("port 9\n")
    changed = check()
    assert changed[0] == f"would change: node-{node.name}" and "redis.conf" in "\n".join(changed[1:]), changed
    assert conf.read_text() == "port 9\n"
