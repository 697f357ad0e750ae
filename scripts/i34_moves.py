#!/usr/bin/env python3
"""Issue 34, WP1: the mechanical moves, renames and merges, as one table (kept until WP10 so an open branch can
rebase through it).

    python3 scripts/i34_moves.py GROUP...      # do the moves of these groups in this checkout (git mv, merges)
    python3 scripts/i34_moves.py --rewrite     # only rewrite old dotted names to new ones (all groups): run it on a
                                               # branch made before the moves, after rebasing, to fix its own lines

Each row is one of:
  ("mv", old, new)              rename a module (git mv, history follows)
  ("merge", target, old)        append old's body to target (created by git mv when it does not exist yet), hoist
                                and de-duplicate imports, join the docstrings, delete old
  ("move", old, new, names)     move these top-level definitions of old to new (new created when missing)

Names are rewritten module by module, longest first, never by package prefix: imports (also `from pkg import mod`),
dotted names in strings (monkeypatch targets, `-m opsctl...`), and `opsctl/x/y.py` paths in prose and docs.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("opsctl", "tests", "bench", "scripts", "docs")
EXTRA = ("pyproject.toml", "Makefile", "README.md")
RUFF = "/work/main/.venv/bin/ruff"

Row = tuple  # ("mv", old, new) | ("merge", target, old) | ("move", old, new, names)

GROUPS: dict[str, list[Row]] = {
    "base": [
        ("merge", "opsctl", "base.resources"),
        ("merge", "base.errors", "base.connerr"),
        ("merge", "base.words", "base.tty"),
        ("mv", "spec.record", "base.record"),
        ("merge", "base.record", "base.digest"),
        ("merge", "base.record", "backup.moments"),
    ],
    "spec": [
        ("merge", "spec.layout", "base.endpoints"),
        ("merge", "spec.layout", "spec.exporters"),
        ("merge", "spec.load", "spec.renames"),
        ("merge", "spec.layout", "spec.tlsrefs"),  # not spec.load: checks imports it, load imports validate
        ("merge", "spec.pydantic_model", "spec.schema"),
        ("mv", "spec.checks", "spec.crosschecks"),
        ("mv", "spec.secretcheck", "spec.secretrefs"),
        ("merge", "spec.secretrefs", "spec.secretpaths"),
        ("merge", "server.versions", "server.command_table"),
        ("mv", "render.exporter", "render.exporteruser"),
    ],
    "observe": [
        ("mv", "observe.parse", "observe.replies"),
        ("merge", "observe.replies", "observe.observation"),
        ("merge", "observe.replies", "observe.replicas"),
        # base.text's ascii_decimal (main, after WP1 began) goes to base.record, beside stored_time: spec.layout's
        # valid_port uses it, and spec stands before observe
        ("move", "base.text", "base.record", ["ascii_decimal"]),
        ("merge", "observe.replies", "base.text"),
    ],
    "plan": [
        ("merge", "plan.facts", "plan.fence"),
        ("merge", "plan.health", "plan.status"),
        ("merge", "plan.desired", "plan.ondisk"),
        ("mv", "plan.node_steps", "plan.servers"),
        ("mv", "plan.replication_steps", "plan.replication"),
        ("merge", "plan.rolling", "plan.maintenance"),
        ("mv", "plan.placing", "plan.shape"),
        # plan.replshape stays: both it and plan.placing define drain_failovers and DRAIN_FIRST
    ],
    "state": [
        # state.nodefiles stays: it imports render, and statedir is on the audit's cheap path
        # (tests/test_audit_rules.py); merged at first, split back after that test
    ],
    "net": [
        # net.discover stays: plan and status import net.observer, and discover's LiveNode is a costly frozen
        # dataclass they must not make (tests/test_cli_start.py); merged at first, split back after that test
    ],
    "stream": [
        ("mv", "plan.streamcmd", "stream.framing"),
        ("mv", "plan.streamkeys", "stream.touched"),
    ],
    "providers": [
        # providers.sockdiag stays: both it and providers.proc define listening_inodes
        ("merge", "providers.localfiles", "providers.serveruser"),
        ("merge", "providers.ansibleexporter", "providers.remote.exporters"),
        # providers.extra and remote.publish stay: ssh imports paramiko at its top, and the extra check (run where
        # paramiko may be missing) and parse_write_to (metrics targets, no SSH) must not
        ("merge", "providers.remote.bundle", "providers.remote.hostsettings"),
        ("merge", "providers.remote.bundle", "providers.remote.staging"),
    ],
    "purity": [  # the two pure modules that reached I/O through one import each
        ("move", "net.observer", "observe.cluster_state", ["observed_problems"]),
        ("move", "net.resp", "observe.replies", ["Arg", "RespError", "Reply", "Command", "TextReply"]),
    ],
    "slots": [
        ("mv", "plan.slotmath.ranges", "slots.ranges"),
        ("mv", "plan.slotmath.balance", "slots.balance"),
        ("mv", "plan.slotmath.coverage", "slots.coverage"),
        ("mv", "plan.slotmath.planning", "slots.slotplan"),
        ("mv", "plan.slotmath.scale", "slots.members"),
        ("mv", "slots.run", "slots.reshard"),
        ("mv", "slots.endpoints", "slots.moveguard"),
    ],
    "failover": [
        ("mv", "plan.verdicts", "failover.verdicts"),
        ("mv", "plan.promotion", "failover.promotion"),
        ("merge", "failover.actions", "failover.session"),  # not runbook (a cycle: runbook imports actions)
    ],
    "cluster": [
        ("mv", "plan.cluster_steps", "cluster.formation"),
        ("mv", "plan.deadnodes", "cluster.deadnodes"),
    ],
    "metrics": [
        ("mv", "plan.exporters", "metrics.exporter"),
    ],
    "runtime": [
        ("mv", "apply.runtime", "runtime.opening"),
        ("merge", "runtime.opening", "apply.connect"),
        ("merge", "runtime.opening", "apply.placing"),
        ("mv", "apply.execution", "runtime.execution"),
        ("move", "apply.gather", "apply.planning",
         ["compute_plan", "filling", "_with_port_warning", "refuse_silent_nodes", "spec_digest"]),
        ("merge", "apply.planning", "plan.ports"),
        ("mv", "apply.gather", "runtime.gather"),
        ("mv", "apply.drift", "runtime.drift"),  # not into gather: status gathers, and must not load the disk facts
        # the exporter facts go beside the disk facts, not into gather: gather imports both lazily, and at its top
        # they would load the exporter's modules into status (tests/test_cli_start.py)
        ("move", "apply.exporter_steps", "runtime.drift", ["Exporters", "exporters_of", "with_exporter_facts"]),
        ("mv", "apply.exporter_steps", "metrics.exporter_steps"),
        ("mv", "apply.waits", "status.looks"),
    ],
    "steps": [
        ("move", "apply.tls_rotation", "tls.handshake", ["handshake", "seen", "_plaintext"]),
        ("mv", "state.planfile", "apply.planfile"),
        ("mv", "plan.metrics", "metrics.targets"),
        ("move", "metrics.targets", "metrics.signals",
         ["RECORDED_COMMANDS", "METRIC_HELP", "_SUCCESS_LINE", "RunSignal", "Outcome", "OUTCOMES", "outcome_of",
          "textfile_name", "last_success_in", "render_textfile", "_exposition", "_escape", "_number", "_slug"]),
        ("merge", "metrics.signals", "state.textfile"),
    ],
    "features": [
        ("mv", "audit.run", "audit.survey"),
        ("mv", "audit.report", "audit.formats"),
        ("merge", "audit.scan", "audit.throttle"),
        ("mv", "backup.plan", "backup.savers"),
        ("mv", "backup.verify", "backup.integrity"),
        # backup.s3 stays: both it and backup.store define _BUCKET
        ("merge", "backup.timeline", "backup.catalog"),
        ("mv", "restore.run", "restore.copying"),
        ("mv", "restore.verify", "restore.tally"),
        ("merge", "restore.sources", "restore.offsets"),
        ("mv", "restore.checks", "restore.preflight"),  # into target it would cycle: checks imports sources
        ("mv", "migrate.apply", "migrate.replay"),
        ("mv", "migrate.run", "migrate.migration"),
        ("mv", "migrate.journal", "migrate.phases"),
        ("merge", "migrate.cutover", "migrate.verify"),
    ],
    "cli": [
        ("merge", "cli.options", "cli.argtypes"),
        ("merge", "cli.options", "cli.confirm"),
        ("merge", "cli.options", "cli.modes"),
        # cli.ttyline stays: `opsctl --help` builds the audit command, which draws with TtyLine, and must not
        # import cli.output's events (tests/test_cli_start.py)
        ("merge", "cli.results", "slots.cli"),
        # cli.spechelp stays: it imports json, and `opsctl --help` builds the help command (tests/test_cli_start.py)
        ("mv", "cli.commands.init", "cli.commands.scaffold"),
        # cli.commands.inventory stays: it and init both define register (COMMANDS names module and function)
    ],
    # WP2/WP3 (done by hand, not by this script: `--rewrite` only renames their imports in an older branch)
    "wp3": [
        ("move", "cli.report", "apply.planning", ["plan_text"]),
        ("move", "cli.report", "status.looks", ["NodeStatus", "node_status", "status_table"]),
        ("move", "cli.results", "apply.planning", ["PlanResult"]),
        ("move", "cli.results", "status.looks", ["StatusResult"]),
        ("move", "cli.runtime", "runtime.opening", ["runs_nowhere"]),
        ("move", "cli.commands.lifecycle", "apply.rounds", ["REPLANS", "SETTLE_SECONDS", "SENTINEL_SETTLE_SECONDS"]),
    ],
}


# Types renamed to give one name per idea (done once by hand in WP1; `--rewrite` renames them in a file that imports
# them from their module): (module, old name, new name).
TYPES = [("slots.session", "Outcome", "SlotsOutcome"), ("metrics.signals", "Outcome", "RunOutcome"),
         ("backup.archive", "Link", "ShardStream")]


def rename_types(path: Path) -> bool:
    src = path.read_text()
    out = src
    for module, old, new in TYPES:
        if re.search(rf"from {re.escape(dotted(module))} import [^\n]*\b{old}\b", out) \
                or re.search(rf"from {re.escape(dotted(module))} import \([^)]*\b{old}\b", out):
            out = re.sub(rf"\b{old}\b", new, out)
    if out != src:
        path.write_text(out)
    return out != src


# ---- names ---------------------------------------------------------------------------------------------------

def dotted(name: str) -> str:
    return name if name == "opsctl" else f"opsctl.{name}"


def path_of(name: str) -> Path:
    if name == "opsctl":
        return ROOT / "opsctl" / "__init__.py"
    return ROOT / (dotted(name).replace(".", "/") + ".py")


def module_of(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    if rel.parts[0] != "opsctl":
        return None
    return ".".join(rel.with_suffix("").parts).removesuffix(".__init__")


def maps(rows: list[Row]) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """Old dotted module -> new dotted module, and (old module, name) -> new module for moved definitions."""
    modules: dict[str, str] = {}
    names: dict[tuple[str, str], str] = {}
    for row in rows:
        if row[0] == "mv":
            old, new = dotted(row[1]), dotted(row[2])
        elif row[0] == "merge":
            old, new = dotted(row[2]), dotted(row[1])
        else:
            for name in row[3]:
                names[(dotted(row[1]), name)] = dotted(row[2])
            continue
        for key, value in list(modules.items()):  # a later row moves an earlier target on
            if value == old:
                modules[key] = new
        for key, value in list(names.items()):
            if value == old:
                names[key] = new
        modules[old] = new
    return modules, names


def files() -> list[Path]:
    kinds = (".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".txt", ".sh")
    found = [p for d in SCOPE for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in kinds]
    found += [ROOT / f for f in EXTRA if (ROOT / f).exists()]
    return [p for p in found if p.name != "i34_moves.py" and "__pycache__" not in p.parts]


def _import_line(indent: str, module: str, aliases: list[tuple[str, str | None]]) -> str:
    parts = [a if not b or b == a else f"{a} as {b}" for a, b in aliases]
    line = f"{indent}from {module} import {', '.join(parts)}"
    if len(line) <= 120:
        return line
    return f"{indent}from {module} import (\n" + "".join(f"{indent}    {p},\n" for p in parts) + f"{indent})"


def rewrite_imports(path: Path, modules: dict[str, str], names: dict[tuple[str, str], str]) -> bool:
    """Rewrite the import statements of one Python file; drop imports of the file's own module."""
    src = path.read_text()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return False
    own = module_of(path)
    lines = src.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opsctl") and not node.level:
            groups: dict[str, list[tuple[str, str | None]]] = {}
            changed = False
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:  # from pkg import mod
                    new = modules[full]
                    parent, _, leaf = new.rpartition(".")
                    target, item, asname = parent, leaf, alias.asname or alias.name
                    changed = True
                elif (node.module, alias.name) in names:
                    target, item, asname = names[(node.module, alias.name)], alias.name, alias.asname
                    changed = True
                elif node.module in modules:
                    target, item, asname = modules[node.module], alias.name, alias.asname
                    changed = True
                else:
                    target, item, asname = node.module, alias.name, alias.asname
                if target == own and (asname is None or asname == item):
                    changed = True
                    continue
                groups.setdefault(target, []).append((item, asname))
            if not changed:
                continue
            first = lines[node.lineno - 1]
            indent = first[: len(first) - len(first.lstrip())]
            text = "\n".join(_import_line(indent, m, a) for m, a in groups.items())
            if not text.strip():
                text = f"{indent}pass" if _alone(tree, node) else ""
            edits.append((node.lineno, node.end_lineno or node.lineno, text + _tail(lines, node)))
        elif isinstance(node, ast.Import):
            new_aliases = []
            changed = False
            for alias in node.names:
                if alias.name in modules:
                    new_aliases.append((modules[alias.name], alias.asname))
                    changed = True
                else:
                    new_aliases.append((alias.name, alias.asname))
            if changed:
                first = lines[node.lineno - 1]
                indent = first[: len(first) - len(first.lstrip())]
                text = "\n".join(f"{indent}import {a}" + (f" as {b}" if b else "") for a, b in new_aliases)
                edits.append((node.lineno, node.end_lineno or node.lineno, text + _tail(lines, node)))
    if not edits:
        return False
    for start, end, text in sorted(edits, reverse=True):
        lines[start - 1:end] = [text + "\n"] if text else []
    path.write_text("".join(lines))
    return True


def _tail(lines: list[str], node: ast.stmt) -> str:
    """What follows the statement on its last line (a comment such as a noqa), kept."""
    rest = lines[(node.end_lineno or node.lineno) - 1][node.end_col_offset or 0:].rstrip("\n")
    return rest if rest.strip() else ""


def _alone(tree: ast.AST, target: ast.stmt) -> bool:
    """Whether target is the only statement of its block (deleting it would leave the block empty)."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and target in block:
                return len(block) == 1
    return False


def rewrite_text(path: Path, modules: dict[str, str], names: dict[tuple[str, str], str]) -> bool:
    """Dotted names and paths, in one pass (no chaining), longest first."""
    src = path.read_text()
    table: dict[str, str] = {}
    for (mod, name), new in names.items():
        table[f"{mod}.{name}"] = f"{new}.{name}"
    for old, new in modules.items():
        if old == "opsctl":
            continue
        table[old] = new
        new_path = (new.replace(".", "/") + ".py") if new != "opsctl" else "opsctl/__init__.py"
        table[old.replace(".", "/") + ".py"] = new_path
        short_old = old.removeprefix("opsctl.").replace(".", "/") + ".py"
        short_new = new.removeprefix("opsctl.").replace(".", "/") + ".py" if new != "opsctl" else "__init__.py"
        table.setdefault(short_old, short_new)
    keys = sorted(table, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w/.])(" + "|".join(re.escape(k) for k in keys) + r")(?![\w])")
    out = pattern.sub(lambda m: table[m.group(1)], src)
    if out != src:
        path.write_text(out)
        return True
    return False


def rewrite(rows: list[Row]) -> list[Path]:
    modules, names = maps(rows)
    touched = []
    for path in files():
        a = rewrite_imports(path, modules, names) if path.suffix == ".py" else False
        b = rewrite_text(path, modules, names)
        if a or b:
            touched.append(path)
    return touched


# ---- moves ---------------------------------------------------------------------------------------------------

def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)


def ensure_package(path: Path) -> None:
    for parent in path.parents:
        if parent == ROOT / "opsctl" or ROOT not in parent.parents:
            break
        init = parent / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")
            git("add", str(init))


def split_module(src: str) -> tuple[str | None, str, str]:
    """(docstring, header: the imports at the top, body: everything after them)."""
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    stmts = list(tree.body)
    doc = None
    start = 0
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0], "value", None), ast.Constant) \
            and isinstance(stmts[0].value.value, str):
        doc = stmts[0].value.value
        start = stmts[0].end_lineno or 0
        stmts = stmts[1:]
    end = start
    for stmt in stmts:
        is_import = isinstance(stmt, (ast.Import, ast.ImportFrom)) or (
            isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test)
            and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in stmt.body))
        if not is_import:
            break
        end = stmt.end_lineno or end
    plain, guarded = [], []
    for stmt in stmts:
        if (stmt.end_lineno or 0) > end:
            break
        text = "".join(lines[stmt.lineno - 1:stmt.end_lineno])
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            continue
        (guarded if isinstance(stmt, ast.If) else plain).append(text)
    header = "".join(plain) + ("\n" if plain and guarded else "") + "\n".join(guarded)
    body = "".join(lines[end:])
    return doc, header, body


def header_parts(header: str) -> tuple[str, str]:
    """(the plain imports, the TYPE_CHECKING blocks) of a header."""
    at = header.find("if TYPE_CHECKING")
    return (header, "") if at < 0 else (header[:at], header[at:])


def join(target_src: str, source_src: str) -> str:
    tdoc, thead, tbody = split_module(target_src)
    sdoc, shead, sbody = split_module(source_src)
    doc = "\n\n".join(d.strip() for d in (tdoc, sdoc) if d)
    out = f'"""{doc}"""\n\nfrom __future__ import annotations\n' if doc else "from __future__ import annotations\n"
    tplain, tguard = header_parts(thead)
    splain, sguard = header_parts(shead)
    out += "\n" + tplain.strip("\n") + "\n" + splain.strip("\n") + "\n\n"
    out += "\n\n".join(g.strip("\n") for g in (tguard, sguard) if g.strip()) + "\n\n"
    out += tbody.strip("\n") + "\n\n\n" + sbody.strip("\n") + "\n"
    return re.sub(r"\n{4,}", "\n\n\n", out)


def do_merge(target: str, source: str) -> None:
    tpath, spath = path_of(target), path_of(source)
    if not tpath.exists():
        ensure_package(tpath)
        git("mv", str(spath), str(tpath))
        return
    merged = join(tpath.read_text(), spath.read_text()) if tpath.read_text().strip() else spath.read_text()
    tpath.write_text(merged)
    git("rm", "-qf", str(spath))


def do_move(old: str, new: str, wanted: list[str]) -> None:
    """Move whole top-level definitions (with their decorators and the comments just above them)."""
    opath, npath = path_of(old), path_of(new)
    src = opath.read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    cut: list[tuple[int, int]] = []
    for stmt in tree.body:
        defined = {getattr(stmt, "name", None)}
        defined |= {t.id for t in getattr(stmt, "targets", []) if isinstance(t, ast.Name)}
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            defined.add(stmt.target.id)
        if defined & set(wanted):
            first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
            while first > 1 and lines[first - 2].lstrip().startswith("#"):
                first -= 1
            cut.append((first, stmt.end_lineno or stmt.lineno))
    moved = "\n\n".join("".join(lines[a - 1:b]).rstrip("\n") for a, b in cut)
    for a, b in sorted(cut, reverse=True):
        del lines[a - 1:b]
    _doc, header, _body = split_module(src)
    left = {getattr(stmt, "name", None) for stmt in tree.body} | {
        t.id for stmt in tree.body for t in getattr(stmt, "targets", []) if isinstance(t, ast.Name)}
    needs = sorted(n for n in left - set(wanted) if n and not n.startswith("__") and re.search(rf"\b{n}\b", moved))
    if needs:  # what the moved definitions use of what stays: imported from where it stays
        header += f"from {dotted(old)} import {', '.join(needs)}\n"
    piece = f"from __future__ import annotations\n{header}\n\n{moved}\n"
    if npath.exists():
        npath.write_text(join(npath.read_text(), piece))
    else:
        ensure_package(npath)
        npath.write_text(f'"""{new}"""\n\n' + piece)
        git("add", str(npath))
    rest = re.sub(r"\n{4,}", "\n\n\n", "".join(lines))
    still = [n for n in wanted if re.search(rf"\b{n}\b", rest)]  # what stays uses a moved name: import it back
    if still:
        line = f"from {dotted(new)} import {', '.join(still)}\n"  # ruff's isort puts it in its place
        rest = rest.replace("from __future__ import annotations\n", "from __future__ import annotations\n\n" + line, 1)
    opath.write_text(rest)


def run_group(name: str) -> None:
    rows = GROUPS[name]
    touched: set[Path] = set()
    for i, row in enumerate(rows):
        if row[0] == "mv":
            ensure_package(path_of(row[2]))
            git("mv", str(path_of(row[1])), str(path_of(row[2])))
        elif row[0] == "merge":
            do_merge(row[1], row[2])
        else:
            do_move(row[1], row[2], list(row[3]))
        touched |= set(rewrite(rows[: i + 1]))
    for path in touched:  # a TYPE_CHECKING block whose imports all went (they name the module itself now)
        if path.exists() and path.suffix == ".py":
            text = path.read_text()
            path.write_text(re.sub(r"\nif TYPE_CHECKING:[^\n]*\n    pass\n", "\n", text))
    if touched:  # the tree was ruff-clean before: what is unsorted or unused now, the moves made so
        subprocess.run([RUFF, "check", "-q", "--fix", "--select", "I,F401", *SCOPE[:4]], cwd=ROOT, check=False)


def all_rows() -> list[Row]:
    return [row for rows in GROUPS.values() for row in rows]


if __name__ == "__main__":
    if sys.argv[1:] == ["--rewrite"]:
        for p in rewrite(all_rows()):
            print(p.relative_to(ROOT))
        for p in files():
            if p.suffix == ".py" and rename_types(p):
                print(p.relative_to(ROOT), "(types)")
    else:
        for group in sys.argv[1:]:
            run_group(group)
