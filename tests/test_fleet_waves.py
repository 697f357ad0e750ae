"""The fleet's pure parts: --waves read and cut, the rollout journal validated when read back, the summary's
lines and exit-code facts, -f DIR's refusals, and the rollout's lock: a second rollout refused naming the holder, a
killed one's record taken over with a note (no servers)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.fleet.rollout import RolloutOptions, cut_waves, parse_waves, rollout
from opsctl.fleet.rolloutlog import LOCK, Journal, journal_path, read_journal, state_folder, write_journal
from opsctl.fleet.summary import FleetResult, Outcome
from opsctl.spec.fleet import Fleet
from opsctl.state.statelock import named_lock

NAMES = tuple("abcdefghij")


@pytest.mark.parametrize(("sizes", "waves"), [
    ("1,25%,100%", ["a", "bc", "defghij"]),
    ("2,100%", ["ab", "cdefghij"]),
    ("1", ["a", "bcdefghij"]),
    ("100%", ["abcdefghij"]),
    ("10%,10%,50%", ["a", "b", "cde", "fghij"]),  # a size no bigger than the last still moves on by one
    ("20,100%", ["abcdefghij"]),
])
def test_waves_are_cumulative_and_cover_the_fleet(sizes: str, waves: list[str]) -> None:
    assert ["".join(w) for w in cut_waves(NAMES, parse_waves(sizes))] == waves


@pytest.mark.parametrize("bad", ["0", "1,,2", "150%", "x", "-1", "0%"])
def test_a_bad_wave_size_is_named(bad: str) -> None:
    with pytest.raises(OpsctlError, match="--waves"):
        parse_waves(bad)


def test_the_journal_round_trips_and_a_bad_one_is_named(tmp_path: Path) -> None:
    journal = Journal("k", (("a",), ("b", "c"))).starting(("a",)).finished("a").gate_passed(0).halt(1, "why")
    write_journal(tmp_path, journal)
    assert read_journal(tmp_path) == journal
    assert journal_path(tmp_path).stat().st_mode & 0o777 == 0o600
    for broken in ("{", json.dumps({"version": 9}), json.dumps({**json.loads(journal.to_json()), "done": [1]})):
        journal_path(tmp_path).write_text(broken)
        with pytest.raises(OpsctlError, match="not a rollout journal") as caught:
            read_journal(tmp_path)
        assert str(journal_path(tmp_path)) in caught.value.summary
    assert read_journal(tmp_path / "none") is None


class Said:
    def __init__(self, line: str) -> None:
        self.line = line

    def text(self) -> str:
        return self.line

    def to_dict(self) -> dict[str, object]:
        return {"said": self.line}


def test_the_summary_has_a_line_per_topology_and_a_total() -> None:
    result = FleetResult("plan", (Outcome("one", Said("fine")), Outcome[Said]("two", None, "boom", "fix it")))
    assert result.text().splitlines() == ["one  fine", "two  FAILED: boom (hint: fix it)",
                                          "plan: 2 topologies, 1 failed (two)"]
    assert result.to_dict() == {"command": "plan", "failed": ["two"], "topologies": [
        {"name": "one", "said": "fine"}, {"name": "two", "error": "boom", "hint": "fix it"}]}


def test_destroy_of_a_folder_needs_only_or_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from opsctl.cli.main import main

    assert main(["destroy", "-f", str(tmp_path), "--auto-approve"]) == 1
    assert "needs --only NAME[,NAME] or --all" in capsys.readouterr().err
    assert main(["plan", "-f", str(tmp_path)]) == 1
    assert "no topology here" in capsys.readouterr().err
    assert main(["apply", "-f", str(tmp_path), "--waves", "1,0", "--auto-approve"]) == 1
    assert "--waves 1,0" in capsys.readouterr().err


def test_a_second_rollout_of_a_folder_is_refused_naming_the_holder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from opsctl.cli.main import main
    from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    write_spec(tmp_path, {**make_spec("standalone", hosts=1), "name": "solo"}, "solo.yaml")
    with named_lock(state_folder(tmp_path), LOCK, "this folder's rollout"):  # a rollout running (this process)
        code = main(["apply", "-f", str(tmp_path), "--waves", "1", "--auto-approve"])
    err = capsys.readouterr().err
    assert code == 1 and "another opsctl run holds this folder's rollout" in err, err
    assert f"(pid {os.getpid()} on {socket.gethostname()}, since 20" in err  # who, where, since when
    assert not journal_path(tmp_path).exists()  # nothing started


def test_a_killed_rollout_s_lock_record_is_taken_over_with_a_note(tmp_path: Path) -> None:
    lock = state_folder(tmp_path) / LOCK
    lock.parent.mkdir()
    lock.write_text("999999999 ghost 2026-12-07T10:00:00Z\n")  # what a SIGKILLed run leaves: its record
    done = rollout(Fleet(str(tmp_path), (), ()), RolloutOptions(("1",)))
    assert done.note == "took over the rollout lock from pid 999999999 on ghost, since 2026-12-07T10:00:00Z: that " \
                        "run is gone"
    assert done.text().splitlines()[0] == f"note: {done.note}"
    assert lock.read_text() == ""  # released cleanly: nothing to take over next time
    assert rollout(Fleet(str(tmp_path), (), ()), RolloutOptions(("1",))).note is None


def test_the_rollout_s_state_folder_lets_a_server_user_through(tmp_path: Path) -> None:
    """The lock makes DIR/.opsctl when it is the first: 0711, as each topology's state dir in it must be reached."""
    rollout(Fleet(str(tmp_path), (), ()), RolloutOptions(("1",)))
    assert state_folder(tmp_path).stat().st_mode & 0o777 == 0o711


def test_the_rollout_lock_is_never_opened_through_a_link(tmp_path: Path) -> None:
    state_folder(tmp_path).mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (state_folder(tmp_path) / LOCK).symlink_to(victim)
    with pytest.raises(OpsctlError, match="cannot be opened"), named_lock(state_folder(tmp_path), LOCK, "it"):
        pass
    assert victim.read_text() == "keep\n"
