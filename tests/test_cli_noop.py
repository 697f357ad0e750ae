"""destroy says only what it did, and a no-op or a dry run leaves nothing on disk (issue 25, defect 3): destroy of a
topology never deployed printed "stopped orders-N and purged its data" for every node and made a lock file;
failover --dry-run made the state dir and a lock file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lifecycle import deployed, run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("extra", [["--purge"], [], ["--purge", "--dry-run"]])
def test_destroy_of_a_topology_never_deployed_does_nothing_and_says_so(tmp_path: Path, extra: list[str],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_spec("cluster"))
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", *extra)
    assert code == 0, err
    assert "stopped" not in out and "purged" not in out, out
    assert out.startswith("nothing to stop"), out
    assert _files(tmp_path) == ["topology.yaml"]  # no .opsctl, no lock file


def test_destroy_asks_nothing_when_there_is_nothing_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No --auto-approve and no terminal: a no-op is not refused, there is nothing to consent to."""
    spec = write_spec(tmp_path, make_spec("standalone", hosts=1))
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge")
    assert code == 0 and out.startswith("nothing to stop"), err


@pytest.mark.parametrize("argv", [
    ["failover", "--shard", "1", "--dry-run"],
    ["cluster", "reshard", "--from", "x-1", "--to", "x-3", "--slots", "1", "--dry-run"],
])
def test_a_dry_run_writes_nothing(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Refused or not (no node answers here), a dry run leaves the spec's folder as it was."""
    topology = "cluster" if argv[0] == "cluster" else "replication"
    spec = write_spec(tmp_path, make_spec(topology))
    run(capsys, *argv[:1 + (argv[0] == "cluster")], "-f", str(spec), *argv[1 + (argv[0] == "cluster"):])
    assert _files(tmp_path) == ["topology.yaml"]


@pytest.mark.integration
def test_destroy_reports_each_node_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Running: stopped. Stopped already: nothing to stop. Purged: the data of a down node, and then nothing."""
    with deployed(tmp_path, capsys, "standalone", "valkey", hosts=1) as (spec, loaded):
        name = loaded.layout.nodes[0].name
        assert run(capsys, "destroy", "-f", str(spec), "--dry-run")[1] == f"would stop {name}\n"
        assert run(capsys, "destroy", "-f", str(spec), "--auto-approve")[1] == f"stopped {name}\n"
        assert run(capsys, "destroy", "-f", str(spec), "--auto-approve")[1].startswith("nothing to stop")
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
        assert code == 3 and "--force-lock" in err, err + out  # no server answers, one is deployed (issue 33)
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge", "--force-lock")
        assert (code, out) == (0, f"purged the data of {name}\n"), err
        assert run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")[1].startswith("nothing to stop")
