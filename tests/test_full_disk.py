"""Issue 23, class 6: a full disk is named as such. On a small real tmpfs: `backup --to` a full disk, a state file
written by the one writer (safefs.write_private, as the manifest and every state file are), and `apply` with a full
state dir each say which folder is full and how much space is needed; never "cannot read the RDB of the node" nor
"internal error"; nothing is left half-written."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from opsctl.state.safefs import FileProblem, write_private
from tests.lifecycle import deployed, run
from tests.support import PASSWORD, make_spec, missing, server_binary, write_spec
from tests.test_restore_faults import load

pytestmark = pytest.mark.integration


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of size mounted at path (root only), unmounted afterwards whatever happens."""
    if os.geteuid() != 0:
        missing("root (to mount a tmpfs)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0711", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> None:
    """Write into folder until its file system says it is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_state_file_on_a_full_disk_names_the_folder_and_the_space_needed(tmp_path) -> None:
    with tmpfs(tmp_path / "small", "64k") as small:
        fill(small)
        with pytest.raises(FileProblem) as caught:
            write_private(small / "manifest.json", "x" * 10_000)
        text = f"{caught.value.summary}\n{caught.value.hint}"
        assert "disk is full" in text and str(small) in text and "needed" in text, text
        assert [p.name for p in small.iterdir()] == ["filler"]  # no temp file left behind


def test_backup_to_a_full_disk_says_the_backup_folder_is_full(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded), \
            tmpfs(tmp_path / "small", "128k") as small:
        import redis

        node = loaded.layout.servers[0]
        load(redis.Redis(host=node.address, port=node.port, password=PASSWORD), 20_000)
        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(small))
        assert code == 1, err + out
        assert "disk is full" in err and str(small) in err and "needed" in err, err
        assert "cannot read the RDB" not in err and "internal error" not in err, err
        assert list(small.iterdir()) == []  # the partial folder is gone


def test_apply_with_a_full_state_dir_says_so(tmp_path, capsys) -> None:
    server_binary("valkey")
    spec = write_spec(tmp_path, make_spec("standalone", "valkey"))
    with tmpfs(tmp_path / "state", "64k") as state:
        (state / ".lock").write_text("1\n")  # its page is freed and taken again: apply gets past its lock
        fill(state)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve", "--state-dir", str(state))
        run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge", "--state-dir", str(state))
    assert code == 1, err + out
    assert "disk is full" in err and str(state) in err, err
    assert "internal error" not in err, err
