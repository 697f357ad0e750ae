"""The fleet's pure parts: --waves read and cut, the rollout journal validated when read back, the summary's
lines and exit-code facts, and -f DIR's refusals (no servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.fleet.rollout import cut_waves, parse_waves
from opsctl.fleet.rolloutlog import Journal, journal_path, read_journal, write_journal
from opsctl.fleet.summary import FleetResult, Outcome

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
