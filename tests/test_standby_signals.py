"""`opsctl follow --metrics-textfile DIR` (issue 36): the link's lag per source shard as node_exporter's textfile,
refreshed while the link runs, following 0 once it stopped, gone after a switchover; a folder that is wrong refused
before anything, a link at the file's name never written through (and never the link's error)."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from opsctl.base.events import Event, Note
from opsctl.cli.main import build_parser
from opsctl.cli.runsignals import LinkTextfile
from opsctl.metrics.signals import METRIC_HELP, render_follow, textfile_name
from opsctl.migrate.migration import MigrateLag
from opsctl.standby.link import PrimaryAwaited
from opsctl.state.localdirs import state_dir_for
from opsctl.state.specfile import read_spec
from opsctl.state.standbyfiles import Switched, record_switched
from tests.lifecycle import run
from tests.monitoring import ROOT
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, missing, write_spec

STREAMING = {"shard-1": {"phase": "stream", "lag_bytes": 120, "lag_seconds": 0.25, "applied_at": 1795798188.5,
                         "applied": 10, "copied": 3},
             "shard-0": {"phase": "snapshot", "lag_seconds": 0.0, "applied_at": 0.0, "copied": 7}}
NAMES = ("opsctl_standby_following", "opsctl_standby_lag_bytes", "opsctl_standby_lag_seconds",
         "opsctl_standby_link_up", "opsctl_standby_last_applied_timestamp_seconds")


def test_the_textfile_says_each_streaming_shards_lag_and_a_copying_one_has_none() -> None:
    text = render_follow("dr", STREAMING, following=True)
    for name in NAMES:
        assert f"# HELP {name} {METRIC_HELP[name]}" in text and f"# TYPE {name} gauge" in text
    assert 'opsctl_standby_following{topology="dr"} 1\n' in text
    assert 'opsctl_standby_link_up{topology="dr",shard="shard-1"} 1\n' in text
    assert 'link_up{topology="dr",shard="shard-0"}' not in text  # copying: its link is the copy's
    assert 'opsctl_standby_lag_bytes{topology="dr",shard="shard-1"} 120.000\n' in text
    assert 'opsctl_standby_lag_seconds{topology="dr",shard="shard-1"} 0.250\n' in text
    assert 'opsctl_standby_last_applied_timestamp_seconds{topology="dr",shard="shard-1"} 1795798188.500\n' in text
    assert 'opsctl_standby_last_applied_timestamp_seconds{topology="dr",shard="shard-0"} 0.000\n' in text
    assert 'lag_bytes{topology="dr",shard="shard-0"}' not in text and 'seconds{topology="dr",shard="shard-0"} 0.0' \
        not in text.replace("timestamp_seconds", "")  # copying: no lag sample, rather than a false 0
    stopped = render_follow("dr", {"shard-1": {"phase": "stream", "lag_bytes": "x", "lag_seconds": float("nan")}},
                            following=False)
    assert 'opsctl_standby_following{topology="dr"} 0\n' in stopped
    assert 'lag_bytes{topology="dr",shard="shard-1"} -1.000' in stopped  # what is not a number: unknown
    assert 'lag_seconds{topology="dr",shard="shard-1"} -1.000' in stopped


def test_promtool_accepts_the_textfile() -> None:
    path = shutil.which("promtool")
    if path is None:
        missing("promtool (apt-get install prometheus)")
    done = subprocess.run([str(path), "check", "metrics"], input=render_follow("dr", STREAMING, following=True),
                          capture_output=True, text=True, timeout=60, check=False)  # reads stdin
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr  # not even a lint note


def _link(folder: Path, emitted: list[Event]) -> LinkTextfile:
    return LinkTextfile(str(folder), "dr", emitted.append, json_mode=False)


def test_the_link_refreshes_its_file_stops_with_following_0_and_a_switchover_removes_it(tmp_path: Path) -> None:
    emitted: list[Event] = []
    link = _link(tmp_path, emitted)
    path = tmp_path / textfile_name("dr", "follow")
    link(Note("copying"))
    assert not path.exists()  # nothing to say before the first lag report
    link(MigrateLag(STREAMING))
    assert 'lag_bytes{topology="dr",shard="shard-1"} 120.000' in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # node_exporter, another user, reads it
    link(MigrateLag({"shard-1": {**STREAMING["shard-1"], "lag_bytes": 5}}))
    assert "120.000" in path.read_text()  # within a second: not rewritten at each of the link's reports
    link.written -= LinkTextfile.EVERY
    link(MigrateLag({"shard-1": {**STREAMING["shard-1"], "lag_bytes": 5}}))
    assert 'lag_bytes{topology="dr",shard="shard-1"} 5.000' in path.read_text()
    assert len(emitted) == 4  # every event still reaches the screen
    link.stopped(switched=False)
    assert 'opsctl_standby_following{topology="dr"} 0' in path.read_text() and "5.000" in path.read_text()
    link.stopped(switched=True)
    assert not path.exists() and [p.name for p in tmp_path.iterdir()] == []  # no temp file left either


def test_a_link_at_the_files_name_is_never_written_through_and_never_stops_the_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, target = tmp_path / "textfiles", tmp_path / "elsewhere"
    folder.mkdir()
    target.write_text("kept\n")
    (folder / textfile_name("dr", "follow")).symlink_to(target)
    emitted: list[Event] = []
    link = _link(folder, emitted)
    for _ in range(3):
        link.written = 0.0
        link(MigrateLag(STREAMING))
    assert target.read_text() == "kept\n" and len(emitted) == 3
    err = capsys.readouterr().err
    assert err.count("warning: --metrics-textfile") == 1 and "the link goes on" in err, err  # once per cause


def test_follow_with_a_wrong_textfile_folder_refuses_before_anything(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    (tmp_path / "p").mkdir()
    (tmp_path / "s").mkdir()
    primary = write_spec(tmp_path / "p", make_spec("standalone", hosts=1))
    standby = write_spec(tmp_path / "s", make_spec("standalone", hosts=1, follows={"spec": str(primary)}))
    (tmp_path / "file").write_text("")
    for wrong in (tmp_path / "absent", tmp_path / "file"):
        code, out, err = run(capsys, "follow", "-f", str(standby), "--metrics-textfile", str(wrong))
        assert code == 1 and str(wrong) in err and "--collector.textfile.directory" in err, out + err
        assert "Traceback" not in err
    assert sorted(p.name for p in standby.parent.iterdir()) == ["topology.yaml"]  # no state dir, no lock


def test_a_switched_over_standbys_link_is_refused_and_removes_its_textfile(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A service restarted after a switchover (Restart=always) is refused (exit 3, which the unit does not restart)
    and takes the link's textfile away: no RedisStandbyNotFollowing for a standby that now takes writes."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    (tmp_path / "p").mkdir()
    (tmp_path / "s").mkdir()
    primary = write_spec(tmp_path / "p", make_spec("standalone", hosts=1))
    standby = write_spec(tmp_path / "s", make_spec("standalone", hosts=1, follows={"spec": str(primary)}))
    loaded = read_spec(str(standby))
    record_switched(state_dir_for(loaded, None), Switched(1795798188.5, "orders", "primary-lost"))
    folder = tmp_path / "textfiles"
    folder.mkdir()
    left = folder / textfile_name(loaded.spec.name, "follow")
    left.write_text(render_follow(loaded.spec.name, STREAMING, following=False))  # the link stopped before
    code, out, err = run(capsys, "follow", "-f", str(standby), "--metrics-textfile", str(folder))
    assert code == 3 and "was switched over" in err, out + err
    assert list(folder.iterdir()) == []


def test_the_shipped_unit_runs_follow_with_options_opsctl_takes_and_no_secret() -> None:
    unit = (ROOT / "playbooks" / "systemd" / "opsctl-follow@.service").read_text()
    lines = [line for line in unit.splitlines() if not line.startswith("#")]
    settings = dict(line.split("=", 1) for line in lines if "=" in line)
    assert settings["Restart"] == "always" and settings["EnvironmentFile"] == "/etc/opsctl/follow-%i.env"
    assert settings["RestartPreventExitStatus"] == "3" and "143" in settings["SuccessExitStatus"]
    argv = settings["ExecStart"].replace("${OPSCTL_SPEC}", "/etc/opsctl/dr.yaml").replace("%i", "dr").split()
    assert argv[0] == "/usr/local/bin/opsctl"
    args = build_parser().parse_args(argv[1:])  # every option is one `follow` takes
    assert (args.file, args.auto_approve, args.follow_textfile, args.state_dir) == (
        "/etc/opsctl/dr.yaml", True, "/var/lib/prometheus/node-exporter", "/var/lib/opsctl/dr")
    assert args.follow_textfile in settings["ReadWritePaths"].split()  # ProtectSystem=strict: else read-only
    assert not any(word in settings["ExecStart"].lower() for word in ("pass", "secret", "auth"))


def test_a_lost_link_says_link_up_0_and_no_lag() -> None:
    """A shard attaching again (a cut, a failover) has no lag to report: link_up 0 is what RedisStandbyLinkDown
    reads."""
    text = render_follow("dr", {"shard-1": {"phase": "attach", "lag_seconds": 0.1, "applied_at": 1795798188.5}},
                         following=True)
    assert 'opsctl_standby_link_up{topology="dr",shard="shard-1"} 0\n' in text
    assert "opsctl_standby_lag_seconds{" not in text and "opsctl_standby_lag_bytes{" not in text


def test_a_link_waiting_for_its_primary_says_every_shard_is_down_and_keeps_its_file_fresh(tmp_path: Path) -> None:
    """In a cut the link stops and waits (standby/link.wait_for_primary): no lag report comes, so each look's
    PrimaryAwaited turns every shard's link_up to 0 and rewrites the file (its age must not say "killed")."""
    link = _link(tmp_path, [])
    path = tmp_path / textfile_name("dr", "follow")
    link(MigrateLag(STREAMING))
    assert 'link_up{topology="dr",shard="shard-1"} 1' in path.read_text()
    link.written -= LinkTextfile.EVERY
    link(PrimaryAwaited("primary p (3 nodes)", "no node answers", 2.0))
    text = path.read_text()
    assert 'link_up{topology="dr",shard="shard-1"} 0' in text and 'link_up{topology="dr",shard="shard-0"} 0' in text
    assert "opsctl_standby_lag_bytes{" not in text and 'opsctl_standby_following{topology="dr"} 1' in text
    assert 'last_applied_timestamp_seconds{topology="dr",shard="shard-1"} 1795798188.500' in text
    before = path.stat().st_mtime_ns
    link.written -= LinkTextfile.EVERY
    link(PrimaryAwaited("primary p (3 nodes)", "no node answers", 4.0))
    assert path.stat().st_mtime_ns >= before and 'shard="shard-1"} 0' in path.read_text()
