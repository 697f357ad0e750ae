"""--metrics-textfile on real runs (issue 24, item 6): a backup of a real Valkey 9.1 standalone writes ok with the
keys it saved; a backup that fails (its --to is a file) writes error and keeps the last success time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lifecycle import deployed, run
from tests.support import admin_for

pytestmark = pytest.mark.integration


def _samples(path: Path) -> dict[str, str]:
    return {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in path.read_text().splitlines()
            if not line.startswith("#")}


def test_backup_writes_its_outcome_keys_and_keeps_the_last_success(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "textfile"
    metrics.mkdir()
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded):
        node = loaded.layout.servers[0]
        with admin_for(loaded, node) as admin:
            for i in range(25):
                admin.call("SET", f"app:key:{i}", "v")
        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(tmp_path / "backups"),
                             "--metrics-textfile", str(metrics))
        assert code == 0, err + out
        path = metrics / f"opsctl_{loaded.spec.name}_backup.prom"
        first = _samples(path)
        labels = f'{{command="backup",topology="{loaded.spec.name}"}}'
        assert first[f"opsctl_last_run_keys_moved{labels}"] == "25"
        assert first[f'opsctl_last_run_outcome{labels[:-1]},outcome="ok"}}'] == "1"
        success = first[f"opsctl_last_success_timestamp_seconds{labels}"]
        (tmp_path / "not-a-folder").write_text("x")
        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(tmp_path / "not-a-folder"),
                             "--metrics-textfile", str(metrics))
        assert code == 1 and "Traceback" not in err, err + out
        second = _samples(path)
        assert second[f'opsctl_last_run_outcome{labels[:-1]},outcome="error"}}'] == "1"
        assert second[f"opsctl_last_success_timestamp_seconds{labels}"] == success
        assert sorted(p.name for p in metrics.iterdir()) == [path.name]
