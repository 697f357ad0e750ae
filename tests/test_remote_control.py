"""bin/opsctl-node (playbooks/files/opsctl-node.sh), the control script on every remote host, run here as root
against a real server: exactly one party starts a node, and a pidfile alone never makes a process the node's.

The installer's `start`, restart.yml and opsctl's own start all run this script; two of them at once launched a
second server beside the first: it failed with "Address already in use", and its pidfile (a server writes it
before it listens) hid the first, so both starts waited 30 s and failed while the node ran (a CI failure of
test_cluster_through_opsctl_apply showed that log). A pidfile that names another live process (a pid reused
after a reboot) was taken for the node: start reported it `running` without starting anything, and stop sent
that process SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from opsctl import data_dir
from opsctl.base.poll import wait_for
from tests.support import CONDITION_BOUND, free_base_port, loopback_hosts, server_binary

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="the control script runs as root (setpriv, ss -p)")]


@dataclass(frozen=True)
class Host:
    """A spec root as deploy.yml lays it out on a host (bin/, nodes/NODE.env, the node's folder), in tmp."""

    script: Path
    folder: Path
    address: str
    port: int

    def control(self, action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.script), action, "n1"], capture_output=True, text=True, timeout=90,
                              check=False, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})

    @property
    def pidfile(self) -> Path:
        return self.folder / "server.pid"

    def servers(self) -> list[int]:
        """Live processes working in the node's folder (its servers)."""
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, IndexError):
                alive = (proc / "stat").read_text().rpartition(") ")[2][0] != "Z"
                if alive and os.readlink(proc / "cwd") == str(self.folder):
                    found.append(int(proc.name))
        return found


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    binary = server_binary("valkey")
    root = tmp_path / "spec"
    (root / "bin").mkdir(parents=True)
    (root / "nodes").mkdir()
    script = root / "bin" / "opsctl-node"
    script.write_bytes((data_dir("playbooks") / "files" / "opsctl-node.sh").read_bytes())
    script.chmod(0o700)
    folder = root / "n1"
    folder.mkdir(mode=0o700)
    [address] = loopback_hosts(1)
    port = free_base_port([address], 1, bus=False)
    (folder / "redis.conf").write_text(f"bind {address}\nport {port}\ndaemonize yes\ndir {folder}\n"
                                       f"pidfile {folder}/server.pid\nlogfile {folder}/server.log\nsave \"\"\n")
    settings = {"OPSCTL_UNIT": "opsctl-n1", "OPSCTL_DIR": folder, "OPSCTL_BIN": binary,
                "OPSCTL_CONF": folder / "redis.conf", "OPSCTL_ARGS": "", "OPSCTL_PID": folder / "server.pid",
                "OPSCTL_LOG": folder / "server.log", "OPSCTL_PORT": port, "OPSCTL_USER": "root"}
    (root / "nodes" / "n1.env").write_text("".join(f"{k}={shlex.quote(str(v))}\n" for k, v in settings.items()))
    made = Host(script, folder, address, port)
    try:
        yield made
    finally:
        for pid in made.servers():
            os.kill(pid, 9)


def outcome(result: subprocess.CompletedProcess[str]) -> tuple[str, int | None]:
    words = result.stdout.split()
    return (words[0] if words else "", int(words[1]) if len(words) > 1 and words[1].isdigit() else None)


def test_starts_at_once_launch_one_server_and_all_report_it(host: Host) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: host.control("start"), range(4)))
    assert all(r.returncode == 0 for r in results), [r.stdout for r in results]
    [server] = host.servers()
    assert sorted(outcome(r) for r in results) == [("running", server)] * 3 + [("started", server)]
    assert "Address already in use" not in (host.folder / "server.log").read_text()
    assert outcome(host.control("status")) == ("running", server)


def test_a_pidfile_naming_another_process_is_no_server(host: Host) -> None:
    """After a reboot the pidfile may name a live process that is not the node's: start starts the node, and
    stop never signals that process."""
    stranger = subprocess.Popen(["sleep", "60"], cwd=host.folder)
    try:
        host.pidfile.write_text(f"{stranger.pid}\n")
        assert outcome(host.control("status")) == ("stopped", None)
        assert outcome(host.control("stop")) == ("stopped", None)
        word, pid = outcome(host.control("start"))
        assert (word, pid) == ("started", next(p for p in host.servers() if p != stranger.pid))
        host.pidfile.write_text(f"{stranger.pid}\n")
        assert outcome(host.control("stop")) == ("stopped", pid)  # found on its port, stopped
        assert stranger.poll() is None and host.servers() == [stranger.pid]
    finally:
        stranger.kill()
        stranger.wait()


def test_a_server_whose_pidfile_is_gone_counts_as_started(host: Host) -> None:
    """The node's server found on its port is the node: no second server, and its pidfile is written again."""
    word, pid = outcome(host.control("start"))
    assert word == "started"
    host.pidfile.unlink()
    assert outcome(host.control("start")) == ("running", pid)
    assert host.servers() == [pid] and host.pidfile.read_text().strip() == str(pid)
    assert "Address already in use" not in (host.folder / "server.log").read_text()
    began = time.monotonic()
    assert outcome(host.control("stop")) == ("stopped", pid)
    assert host.servers() == [] and time.monotonic() - began < 30  # not the SIGKILL after 30 s


def test_a_server_that_refuses_its_first_sigterm_is_asked_again(host: Host) -> None:
    """A server that cannot shut down yet drops the SIGTERM (Redis 7.0 right after a full sync: "Writing initial
    AOF, can't exit."; here its shutdown save fails while dump.rdb is a folder): stop asks again every second
    instead of waiting 30 s for the SIGKILL, and the server exits on its own once it can save."""
    conf = host.folder / "redis.conf"
    conf.write_text(conf.read_text().replace('save ""', "save 3600 1"))
    word, pid = outcome(host.control("start"))
    assert word == "started"
    (host.folder / "dump.rdb").mkdir()  # the save's rename onto it fails: "Error trying to save the DB, can't exit"
    with ThreadPoolExecutor(max_workers=1) as pool:
        stopping = pool.submit(host.control, "stop")
        log = host.folder / "server.log"
        wait_for(lambda: "can't exit" in log.read_text() or None, CONDITION_BOUND, "the server to drop a SIGTERM", 0.05)
        assert not stopping.done() and host.servers() == [pid]
        (host.folder / "dump.rdb").rmdir()
        began = time.monotonic()
        assert outcome(stopping.result()) == ("stopped", pid)
    # asked again every second, not the 30 s SIGKILL (5.5 s seen on a loaded machine)
    assert time.monotonic() - began < 30 and host.servers() == []
    assert "can't exit" in (host.folder / "server.log").read_text()
