"""One topology of a fleet on the Ansible lab beside a local one (issue 35, must show): a folder holding a provider:
ansible standalone on a network-namespace host and a provider: local standalone on loopback, applied, planned empty
and statused as one through -f DIR; `inventory -f DIR` writes the ansible one's and leaves the local one out; the
folder destroyed with --all --purge."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, netns_lab, server_binary, write_spec

pytestmark = pytest.mark.remote


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    yield from netns_lab(1)


def test_an_ansible_topology_beside_a_local_one(lab: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    folder = tmp_path / "fleet"
    folder.mkdir(mode=0o711)
    tmp_path.chmod(0o711)  # the local server's user passes through to its state dir
    remote = make_spec("standalone", "valkey", hosts=1)
    remote.update(name="r-lab", provider="ansible", hosts=lab.spec_hosts())
    remote["server"]["binary"] = server_binary("valkey")
    local = make_spec("standalone", "valkey", hosts=1)
    local.update(name="l-here", hosts=[{**local["hosts"][0], "name": "here"}])
    write_spec(folder, remote, "r-lab.yaml")
    write_spec(folder, local, "l-here.yaml")
    try:
        code, out, err = run(capsys, "apply", "-f", str(folder), "--auto-approve", "--output", "json")
        assert code == 0, out[-3000:] + err[-3000:]
        applied = json.loads(out)
        assert [t["name"] for t in applied["topologies"]] == ["l-here", "r-lab"] and not applied["failed"]
        assert all(t["healthy"] for t in applied["topologies"])
        code, out, err = run(capsys, "plan", "-f", str(folder))
        assert code == 0 and out.count("no changes") == 2, out + err
        code, out, err = run(capsys, "status", "-f", str(folder))
        assert code == 0 and "status: 2 topologies" in out, out + err
        code, out, err = run(capsys, "inventory", "-f", str(folder), "--dir", str(tmp_path / "inv"))
        assert code == 0 and "left out (provider: local, no inventory): l-here" in err, out + err
        assert sorted(p.name for p in (tmp_path / "inv").iterdir() if p.is_file()) == ["r-lab.yml"]
        assert PASSWORD not in out + err
    finally:
        code, out, err = run(capsys, "destroy", "-f", str(folder), "--all", "--purge", "--auto-approve")
        assert code == 0, out + err
    assert "valkey-server" not in " ".join(lab.processes(lab.hosts[0]))
