"""Text for people and the routes behind it: plurals, the status LAG column, progress lines on and off a
terminal, and the audit/bigkey commands going through the spec's admin routes (SSH tunnels)."""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import opsctl
from opsctl.apply.executor import StepDone, StepFailed, StepStart
from opsctl.apply.rounds import Replanning, RoundDone
from opsctl.audit.bigdelete import delete_big_key, owner_node
from opsctl.audit.scan import ScanProgress
from opsctl.backup.follow import ArchiveProgress, ArchiveStopped, SegmentArchived
from opsctl.backup.integrity import ChecksumsOk, ShardVerified, VerifyDone
from opsctl.backup.save import BackupDone, BackupStart, ShardCopying, ShardSaved
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Event, Log, Note, Tagged, as_dict, human_seconds, plural
from opsctl.cli.commands.audit import ProgressBar, scan_line
from opsctl.cli.main import main
from opsctl.cli.output import Printer, printing, say
from opsctl.cli.ttyline import TtyLine, redraw
from opsctl.migrate.cutover import CutoverDone
from opsctl.migrate.migration import MigrateLag
from opsctl.net.connector import Connector
from opsctl.observe.replies import RoleInfo
from opsctl.providers.remote.runner import PlaybookTask
from opsctl.restore.copying import RestoreDone, RestoreDryRun, RestoreProgress
from opsctl.runtime.gather import NodesSettling
from opsctl.slots.members import wider_layout
from opsctl.slots.progress import (
    BigKey,
    BusyKeyEqual,
    Closed,
    EndpointDown,
    EndpointReplacedEvent,
    MigrateRetry,
    Progress,
    SlotsClosed,
    SlotsDone,
    SlotsProgress,
    SlotsSkip,
    SlotsStart,
    done_fraction,
)
from opsctl.spec.layout import Node
from opsctl.standby.link import PrimaryAwaited
from opsctl.state.specfile import read_spec
from opsctl.status.looks import node_status, status_table
from tests.support import make_spec, write_spec
from tests.test_audit_fixtures import standalone
from tests.test_failover_checks import facts_for, spec

CONTROL = ("\r", "\x1b")


# --- plurals --------------------------------------------------------------------------------------


def test_plural_and_validate_say_one_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (plural(1, "node"), plural(0, "replica"), plural(3, "key"), plural(2, "index", "indexes")) == (
        "1 node", "0 replicas", "3 keys", "2 indexes")
    one = write_spec(tmp_path, make_spec("standalone", hosts=1))
    assert main(["validate", "-f", str(one)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(", 1 node")
    assert main(["validate", "-f", str(write_spec(tmp_path, make_spec("cluster"), "c.yaml"))]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(", 6 nodes")


# --- status: LAG and offsets ----------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["standalone", "replication", "sentinel", "cluster"])
def test_status_lag_column_in_every_topology(tmp_path: Path, topology: str) -> None:
    loaded = spec(tmp_path, topology)
    shard = loaded.layout.shards[0]
    lagging = shard.replicas[-1] if shard.replicas else None
    rows = {r.name: r for r in node_status(loaded.layout, facts_for(loaded, lag={lagging: 700} if lagging else {}))}
    assert rows[shard.master].lag == (700 if lagging else None)  # a master: its slowest replica
    for name in shard.replicas:
        assert rows[name].lag == (700 if name == lagging else 0) and rows[name].offset is not None
    for s in loaded.layout.sentinels:
        assert (rows[s.name].lag, rows[s.name].offset, rows[s.name].lag_text) == (None, None, "-")
    table = status_table(list(rows.values()))
    assert "LAG" in table.splitlines()[0]
    if lagging:  # the column names its unit: offsets apart are bytes, never a bare number read as seconds
        assert rows[lagging].lag_text == "700B" and " 700B " in table
        assert replace(rows[lagging], lag=3 << 20).lag_text == "3.0MiB"
    data = json.loads(json.dumps([r.as_dict() for r in rows.values()]))
    assert all("offset" in d and "lag" in d for d in data)
    if not lagging:
        assert rows[shard.master].lag_text == "-" and rows[shard.master].offset == 100_000


def test_status_lag_of_a_replica_with_an_unknown_or_silent_master(tmp_path: Path) -> None:
    loaded = spec(tmp_path, "cluster")
    shard = loaded.layout.shards[0]
    replica = shard.replicas[0]
    facts = facts_for(loaded)
    facts[replica] = replace(facts[replica], role=RoleInfo("replica", 5, ("10.9.9.9", 7000), "connected"))
    row = next(r for r in node_status(loaded.layout, facts) if r.name == replica)
    assert (row.lag, row.lag_text, row.offset) == (None, "?", 5)
    silent = facts_for(loaded, down=[shard.master])
    row = next(r for r in node_status(loaded.layout, silent) if r.name == replica)
    assert (row.lag, row.lag_text) == (None, "?")
    ahead = facts_for(loaded)  # observed after more writes than its master was: never a negative lag
    master = loaded.layout.node(shard.master)
    master_role = ahead[shard.master].role
    assert master_role is not None
    ahead[shard.master] = replace(ahead[shard.master], role=replace(master_role, replicas=()))
    ahead[replica] = replace(ahead[replica], role=RoleInfo("replica", 100_500, (master.address, master.port),
                                                           "connected"))
    row = next(r for r in node_status(loaded.layout, ahead) if r.name == replica)
    assert row.lag == 0


# --- progress lines -------------------------------------------------------------------------------


def test_redraw_fits_the_terminal_and_erases_the_rest() -> None:
    assert redraw("x" * 200, 80) == "\r" + "x" * 79 + "\x1b[K"
    assert redraw("short", 80) == "\rshort\x1b[K"
    assert [human_seconds(s) for s in (None, 3.4, 125, 4000)] == ["-", "3s", "2m05s", "1h06m"]
    assert done_fraction(0, 100, 50, 200) == 0.25 and done_fraction(50, 100, 10, 200) == 0.5
    assert done_fraction(10, 100, 900, 200) == 0.99 and done_fraction(100, 100, 10, 200) == 1.0
    assert done_fraction(10, 100, 5, 0) == 0.1


def test_tty_line_redraws_in_place_and_ends_clean() -> None:
    stream = io.StringIO()
    line = TtyLine(stream, interval=60)
    line.show("one")
    line.show("skipped: within the interval")
    line.done("final")
    assert stream.getvalue() == "\rone\x1b[K\rfinal\x1b[K\n"


def test_audit_progress_bar_shows_rate_eta_and_the_final_count() -> None:
    assert scan_line(50, 100, 3, 2.0) == "[##########..........] 50/100 keys, 3 nodes  25 keys/s  ETA 2s"
    assert scan_line(50, 100, 1, 2.0).endswith(", 1 node  25 keys/s  ETA 2s")
    assert scan_line(120, 100, 1, 1.0).endswith("ETA 0s") and scan_line(0, 10, 1, 0.0).endswith("ETA -")
    stream = io.StringIO()
    bar = ProgressBar(stream)
    bar("a", 10, 100)
    bar("b", 5, 50)  # throttled
    bar("a", 100, 100)
    bar("b", 50, 50)
    bar.close()
    text = stream.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    assert text.rsplit("\r", 1)[1].startswith("[####################] 150/150 keys, 2 nodes")
    quiet = io.StringIO()
    ProgressBar(quiet).close()
    assert quiet.getvalue() == ""


def test_slot_events_without_a_terminal_have_no_bar_and_no_control_characters() -> None:
    stream = io.StringIO()
    emit = Printer(False, stream)
    progress = Progress(emit, 100, est_keys=1000)
    emit(SlotsStart("key-by-key", 100, ({"slot_count": 100},)))
    for _ in range(10):
        progress.add(slots=10, keys=100, size=1000)
    final = progress.finish()
    text = stream.getvalue()
    assert not any(c in text for c in CONTROL)
    assert text.splitlines() == ["moving 100 slots (key-by-key)", final.line()]
    assert "ETA 0s" in text and "100/100 slots" in text


EVERY_KIND: list[Event] = [
    StepStart(1, 3, "move slots"), Log("move slots", "waiting"), SlotsStart("atomic", 10, ()),
    SlotsProgress(5, 10, 50, 5000, 25.0, 2.0, 2.0), BigKey(3, "k", 10 << 20, 9000), MigrateRetry(3, 10, "IOERR"),
    BusyKeyEqual(3, "k"), Closed("a", "b", True, {"finish": "3"}), SlotsSkip("move slots", "already moved"),
    SlotsClosed("journaled a -> b: finish 3"), SlotsDone(10, 10, 100, 10000, 50.0, 2.0, 0.0),
    EndpointDown("target", "n3"), EndpointReplacedEvent("target", "n3"),
    StepDone(1, "move slots", 2.5), StepFailed(2, "close slots", "boom"),
    BackupStart(2, "/b/x-1", {1: "n1", 2: "n4"}), ShardCopying(1, "n4", 1 << 19, 1 << 20),
    ShardSaved(1, "n4", "replica", 1 << 20, 1, 2),
    BackupDone("/b/x-1", 100, 2 << 20, 1.5), SegmentArchived(1, "x.seg", 0, 90, 3, 200, 1.0, 1.5, 2.0),
    ArchiveProgress("x-1", 4, 800, {1: 90, 2: 0}), ArchiveStopped("SIGTERM", "every segment read is archived"),
    ChecksumsOk(2), ShardVerified(1, "shard-1.rdb", 50),
    VerifyDone(True, 100), RestoreProgress(40, 100, 20, 2.0),
    RestoreDone("backup /b/x-1", "t", "replace", False, False, True, 100, 100, 0, 0, 0, 5.0, 20, 10, (),
                {"shard-1": {"keys": 100, "restored": 100, "existing": 0, "skipped": 0, "conflicts": 0}}),
    RestoreDryRun("backup /b/x-1", "t", "replace", True, False, True, 0, 0, 0, 0, 0, 0.0, None, 0, (), {}),
    Note("pre-checks for shard 1"), ScanProgress("n1", 10, 100),
    MigrateLag({"shard-1": {"phase": "stream", "lag_bytes": 10, "lag_seconds": 0.1, "applied": 5},
                "shard-2": {"phase": "snapshot", "copied": 7}}),
    PrimaryAwaited("primary p (1 node)", "no node answers", 4.0),
    CutoverDone(True, 0.2, 0.05, 10, 10, 5, {"shard-1": 100}, ("127.0.0.2:7000",), ()),
    RoundDone(3, 1.5), Replanning(("n1",)), Tagged("shop", Note("pre-checks for shard 1")),
    NodesSettling(30.0, {"n2": "runs but does not answer (timeout)"}),
    PlaybookTask("deploy.yml", "h1", "copy files", "changed")]
REDRAWN_KINDS = 9  # slots-progress, shard-copying, shard-saved, restore-progress, playbook-task, migrate-lag,
# segment-archived, archive-progress, primary-awaited: on terminals only (elsewhere a heartbeat line every few
# seconds: none here)


def every_event_class() -> set[type[Event]]:
    """Every event opsctl declares, each in its feature's package: the classes on the Event protocol."""
    for module in pkgutil.walk_packages(opsctl.__path__, "opsctl."):
        importlib.import_module(module.name)
    found: set[type[Event]] = set()
    todo: list[type[Event]] = list(Event.__subclasses__())
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return {cls for cls in found if cls.__module__.startswith("opsctl.")}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_every_event_has_a_text_form_and_a_json_form() -> None:
    kinds = {type(e) for e in EVERY_KIND}
    assert kinds == every_event_class()
    stream = io.StringIO()
    emit = Printer(False, stream)
    for event in EVERY_KIND:
        emit(event)
    lines = stream.getvalue().splitlines()
    assert len(lines) == len(EVERY_KIND) - REDRAWN_KINDS
    assert "slots-skip: move slots: already moved" in lines and "slots-closed: journaled a -> b: finish 3" in lines
    assert "closed: a -> b (journaled): finish 3" in lines
    assert not any(c in stream.getvalue() for c in CONTROL)
    json_stream = io.StringIO()
    emit = Printer(True, json_stream)
    for event in EVERY_KIND:
        emit(event)
    decoded = [json.loads(line) for line in json_stream.getvalue().splitlines()]
    assert [d["event"] for d in decoded] == [e.kind for e in EVERY_KIND]
    assert decoded[3] == {"event": "slots-progress", **as_dict(EVERY_KIND[3]), "eta": 2.0}
    assert decoded[1] == {"event": "log", "step": "move slots", "text": "waiting"}
    by_kind = {d["event"]: d for d in decoded}  # the keys backup, restore and their readers rely on
    assert by_kind["backup-start"] == {"event": "backup-start", "shards": 2, "dir": "/b/x-1",
                                       "savers": {"1": "n1", "2": "n4"}}
    assert by_kind["shard-saved"]["role"] == "replica" and by_kind["backup-done"]["dir"] == "/b/x-1"
    assert by_kind["restore-done"]["sources"]["shard-1"]["restored"] == 100
    assert by_kind["restore-done"]["problems"] == [] and by_kind["restore-dry-run"]["dry_run"] is True
    assert by_kind["verify-done"] == {"event": "verify-done", "ok": True, "keys": 100}


def test_apply_steps_and_the_slot_bar_share_one_terminal_line_cleanly() -> None:
    stream = Terminal()
    emit = Printer(False, stream)
    for event in EVERY_KIND:
        emit(event)
    text = stream.getvalue()
    bar = SlotsProgress(5, 10, 50, 5000, 25.0, 2.0, 2.0).line()
    assert "\r" + bar + "\x1b[K" in text
    after_bar = text.split(bar, 1)[1]
    assert after_bar.startswith("\x1b[K\r\x1b[Kbig-key: slot 3")  # the bar is erased before the next line
    assert "\r" + RestoreProgress(40, 100, 20, 2.0).line() + "\x1b[K" in text
    assert "\r" + ShardSaved(1, "n4", "replica", 1 << 20, 1, 2).line() + "\x1b[K" in text
    assert text.endswith("\r" + PlaybookTask("deploy.yml", "h1", "copy files", "changed").line() + "\x1b[K")


def test_off_a_terminal_progress_is_a_heartbeat_line_every_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33 item 8: migrate and the archiver said nothing for minutes off a terminal. Now the newest progress
    prints as a plain line once HEARTBEAT seconds passed since the last (none in a run shorter than that); a
    segment alone is the bar's only, the archive's heartbeat is its summary."""
    import opsctl.cli.output as output

    now = [1000.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    emit = Printer(False, stream, heartbeat=5.0)
    lag = MigrateLag({"shard-1": {"phase": "stream", "lag_bytes": 10, "lag_seconds": 0.1, "applied": 5}})
    progress = ArchiveProgress("x-1", 4, 800, {1: 90})
    for second in range(21):  # an event every second for 20 s
        now[0] = 1000.0 + second
        emit(lag)
        emit(SegmentArchived(1, "x.seg", 0, 90, 3, 200, 1.0, 1.5, 2.0))
        emit(progress)
    lines = stream.getvalue().splitlines()
    assert lines == [lag.line()] * 4  # at 5, 10, 15 and 20 s: the first event due each time
    assert not any(c in stream.getvalue() for c in CONTROL)
    archive = io.StringIO()
    now[0] = 2000.0
    emit = Printer(False, archive, heartbeat=5.0)
    for second in range(11):
        now[0] = 2000.0 + second
        emit(SegmentArchived(1, "x.seg", 0, 90, 3, 200, 1.0, 1.5, 2.0))
        emit(progress)
    assert archive.getvalue().splitlines() == [progress.line()] * 2
    assert progress.line() == "archiving base x-1: 4 segments (800B) stored; shard 1 at offset 90"
    terminal = Terminal()  # a terminal keeps its bar: every event redrawn, no heartbeat lines
    emit = Printer(False, terminal, heartbeat=5.0)
    now[0] += 60
    emit(progress)
    assert terminal.getvalue() == "\r" + progress.line() + "\x1b[K"


def test_a_bar_left_drawn_is_erased_when_the_printer_closes() -> None:
    stream = Terminal()
    with printing(False, stream) as emit:
        emit(RestoreProgress(40, 100, 20, 2.0))
    assert stream.getvalue().endswith("\x1b[K\r\x1b[K")
    with pytest.raises(RuntimeError), printing(False, stream) as emit:
        emit(ShardSaved(1, "n4", "replica", 1, 1, 2))
        raise RuntimeError
    assert stream.getvalue().endswith("\x1b[K\r\x1b[K")


def test_a_round_end_goes_through_the_printer_as_text_or_a_json_line() -> None:
    """Issue 34 (events): apply's and restart's round end and replan were plain lines on stderr, also under
    --output json. Now they are events: the same text (restart's in its own words), a JSON line as JSON."""
    from opsctl.cli.commands.lifecycle import rounds_printer

    text, as_json = Terminal(), io.StringIO()
    for stream, json_mode in ((text, False), (as_json, True)):
        emit = rounds_printer(Printer(json_mode, stream), done="Restarted")
        emit(SlotsProgress(5, 10, 50, 5000, 25.0, 2.0, 2.0))
        emit(Replanning(("n1",)))
        emit(RoundDone(3, 1.5))
    assert text.getvalue().endswith("\x1b[K\r\x1b[Kn1 ran when apply looked and is down now: planning again\n"
                                    "\r\x1b[KRestarted in 1.50s.\n")  # the bar erased before each line
    assert [json.loads(line)["event"] for line in as_json.getvalue().splitlines()] == [
        "slots-progress", "replanning", "round-done"]


def test_a_note_outside_a_run_is_a_line_or_a_json_note() -> None:
    text, as_json = io.StringIO(), io.StringIO()
    say("note: nothing deployed", False, text)
    say("note: nothing deployed", True, as_json)
    assert text.getvalue() == "note: nothing deployed\n"
    assert json.loads(as_json.getvalue()) == {"event": "note", "text": "note: nothing deployed"}


# the printer itself, the command line's error path (an error is no event: it ends the run), and the sink of a
# library call given none where silence would hide a risk (base.events.on_stderr)
STDERR_ALLOWED = ("opsctl/cli/output.py", "opsctl/cli/main.py", "opsctl/base/events.py")


def test_no_line_bypasses_the_printer() -> None:
    """Issue 34 (events): 14 plain lines on stderr went around the printer (a lock's warning, gather's wait, the
    round ends, notes of metrics, migrate, cluster fix and inventory), plain text under --output json. Every line
    for people is an event now: no print(file=sys.stderr) nor sys.stderr.write outside the printer."""
    import ast

    root = Path(opsctl.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        where = str(path.relative_to(root.parent))
        if where in STDERR_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            target = ast.unparse(node.func)
            to_stderr = any(k.arg == "file" and "stderr" in ast.unparse(k.value) for k in node.keywords)
            if (target == "print" and to_stderr) or target.endswith("stderr.write"):
                found.append(f"{where}:{node.lineno}")
    assert not found, found


# --- routes of audit and bigkey delete ------------------------------------------------------------


def _nodes_text(*lines: tuple[str, str]) -> str:
    return "\n".join(f"{i:040x} {ep}@1 {flags} - 0 0 1 connected {slots}" for i, (ep, flags, slots) in
                     enumerate([(ep, "master", slots) for ep, slots in lines]))


def test_the_owner_of_a_key_is_a_node_of_the_spec(tmp_path: Path) -> None:
    loaded = read_spec(write_spec(tmp_path, make_spec("cluster")))
    first, second = loaded.layout.servers[:2]
    owner = owner_node(loaded, _nodes_text((first.endpoint, "0-100"), (second.endpoint, "101-16383")), b"k")
    assert owner == second  # slot of "k" is 7629
    # a node a larger spec had (scale-in leaves it serving slots until drained) is still reached as a Node
    extra = next(n for n in wider_layout(loaded).servers if loaded.layout.find(n.endpoint) is None)
    assert owner_node(loaded, _nodes_text((extra.endpoint, "0-16383")), b"k") == extra
    with pytest.raises(OpsctlError, match="a node the spec does not describe"):
        owner_node(loaded, _nodes_text(("10.1.2.3:7000", "0-16383")), b"k")
    with pytest.raises(OpsctlError, match="no master serves slot"):
        owner_node(loaded, _nodes_text((first.endpoint, "0-10")), b"k")


@pytest.mark.integration
def test_audit_and_bigkey_delete_use_the_admin_routes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import opsctl.runtime.opening

    entered: list[tuple[str, Path]] = []
    make_connector = opsctl.runtime.opening.make_connector

    def recording(loaded: Any, state_dir: Path, route: Any = None) -> Connector:
        entered.append((loaded.spec.name, state_dir))
        return make_connector(loaded, state_dir, route)

    monkeypatch.setattr(opsctl.runtime.opening, "make_connector", recording)
    with standalone(tmp_path, "valkey") as fleet:
        fleet.admin().client.rpush("big:list", *range(2000))
        state = str(tmp_path / "state")
        assert main(["audit", "-f", str(fleet.spec_file), "bigkeys", "--allow-masters", "--nice", "0",
                     "--elements", "1000", "--state-dir", state]) == 4
        out = capsys.readouterr()
        assert "1 finding\n" in out.out and not any(c in out.out + out.err for c in CONTROL)
        assert main(["bigkey", "delete", "-f", str(fleet.spec_file), "big:list", "--dry-run",
                     "--state-dir", state]) == 0
        assert entered == [(fleet.loaded.spec.name, Path(state).resolve())] * 2
        routed: list[Node] = []

        def route(node: Node) -> tuple[str, int]:
            routed.append(node)
            return node.address, node.port

        assert delete_big_key(Connector(fleet.loaded, route), b"big:list", chunked=True).removed == 2000
        assert routed and {n.name for n in routed} == {fleet.loaded.layout.servers[0].name}


def test_no_eta_before_five_percent_of_the_work() -> None:
    progress = Progress(lambda event: None, 100, est_keys=1000)
    progress.keys = 10
    assert progress.event().eta is None
    progress.keys = 100
    assert progress.event().eta is not None


def test_audit_progress_off_a_terminal_is_a_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off a terminal the audit said nothing while it scanned: now a plain line every heartbeat, and the final
    counts once one was said (a short scan stays silent, as before)."""
    import opsctl.cli.commands.audit as audit

    now = [100.0]
    monkeypatch.setattr(audit.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    bar = ProgressBar(stream, heartbeat=5.0)
    for second in range(12):
        now[0] = 100.0 + second
        bar("a", second * 10, 200)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].endswith("keys/s  ETA 15s") and "110/200 keys" in lines[-1], lines
    assert not any(c in stream.getvalue() for c in CONTROL)
    quiet = io.StringIO()
    short = ProgressBar(quiet, heartbeat=5.0)
    short("a", 10, 10)
    short.close()
    assert quiet.getvalue() == ""
