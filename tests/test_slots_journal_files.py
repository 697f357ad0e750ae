"""The slot journal is written like every other state file (issue 23): through safefs.append_private, never
through a link, never blocking on a fifo planted at its name, fsynced, and a full disk is named with the space
needed; a failed append leaves no torn line for the next append to follow."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from opsctl.slots.journal import JOURNAL, Journal
from opsctl.state.safefs import FileProblem


def test_the_journal_refuses_a_planted_link_and_leaves_its_target_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    state = tmp_path / "state"
    state.mkdir()
    (state / JOURNAL).symlink_to(victim)
    with pytest.raises(FileProblem, match="symbolic link"):
        Journal(state).opened("a", "ida", "b", "idb", [1, 2])
    assert victim.read_text() == "precious"


def test_a_fifo_at_the_journal_name_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / JOURNAL)  # before: O_WRONLY on a fifo without a reader blocked the run for good
    with pytest.raises(FileProblem, match="not a regular file"):
        Journal(tmp_path).closed([1])


def test_a_folder_at_the_journal_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / JOURNAL).mkdir()
    with pytest.raises(FileProblem, match="not a regular file"):
        Journal(tmp_path).closed([1])


def test_each_append_is_fsynced(tmp_path: Path) -> None:
    real = os.fsync
    with mock.patch("opsctl.state.safefs.os.fsync", side_effect=real) as fsync:
        Journal(tmp_path).opened("a", "ida", "b", "idb", [7])
    assert fsync.called
    assert (tmp_path / JOURNAL).stat().st_mode & 0o777 == 0o600


def test_a_failed_append_is_cut_back_off_so_no_torn_line_stays(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.opened("a", "ida", "b", "idb", [7])
    before = journal.path.read_bytes()
    real = os.write

    def short_then_full(fd: int, data: bytes | memoryview) -> int:
        if short_then_full.calls:  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device")
        short_then_full.calls += 1  # type: ignore[attr-defined]
        return real(fd, bytes(data[:10]))

    short_then_full.calls = 0  # type: ignore[attr-defined]
    with mock.patch("opsctl.state.safefs.os.write", side_effect=short_then_full), \
            pytest.raises(FileProblem) as caught:
        journal.closed([7])
    assert "disk is full" in caught.value.summary and "needed" in caught.value.summary, caught.value.summary
    assert journal.path.read_bytes() == before
    assert [e.OP for e in journal.entries()] == ["open"]
    journal.closed([7])
    assert journal.pending() == []


@pytest.mark.integration
def test_a_journal_on_a_full_disk_names_the_folder(tmp_path: Path) -> None:
    from tests.test_full_disk import fill, tmpfs

    with tmpfs(tmp_path / "state", "64k") as state:
        fill(state)
        with pytest.raises(FileProblem) as caught:
            Journal(state).opened("a", "ida", "b", "idb", list(range(0, 16384, 2)))
        text = f"{caught.value.summary}\n{caught.value.hint}"
        assert "disk is full" in text and str(state) in text and "needed" in text, text
        assert not (state / JOURNAL).exists() or (state / JOURNAL).read_bytes() == b""
