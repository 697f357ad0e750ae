"""The house: opsctl's packages stand in one order and each imports only from those before it, every kind of
import counted (top level, inside a function, under TYPE_CHECKING); no module imports itself back through others.
The first packages are the functional core: parsing a spec, rendering files, planning steps and judging what nodes
said reach no socket, process, thread or client library, not even through another opsctl module; a pure module of a
feature (PURE) stands with the core. One idea per file (no fragments), one name per idea. The map:
docs/architecture.md."""

from __future__ import annotations

import ast
import io
import tokenize
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opsctl"

# Each package may import from those before it, never after. The top-level `opsctl` is the package face
# (its version); it imports nothing of opsctl, so every package may read it.
ORDER = ("base", "server", "spec", "observe", "render", "plan", "state", "net", "tls", "stream", "providers",
         "runtime", "status", "slots", "failover", "cluster", "metrics", "apply", "backup", "restore", "migrate",
         "standby", "destroy", "audit", "fleet", "cli")
# The pure core: what these reach decides nothing about the world outside the process but files the caller names.
CORE = ORDER[: ORDER.index("plan") + 1]
# Pure modules that live beside their feature's I/O: each ranks as the top of the core (the planner, `plan`) and
# stands in that room for the package-cycle check, so the planner may import them and they import only the core and
# one another.
PURE = ("opsctl.stream.framing", "opsctl.stream.touched", "opsctl.slots.ranges", "opsctl.slots.balance",
        "opsctl.slots.loadplan", "opsctl.slots.coverage", "opsctl.slots.slotplan", "opsctl.slots.members",
        "opsctl.slots.batching",
        "opsctl.slots.moveguard", "opsctl.failover.checks", "opsctl.failover.verdicts", "opsctl.failover.promotion",
        "opsctl.cluster.check", "opsctl.cluster.formation", "opsctl.cluster.deadnodes", "opsctl.metrics.exporter",
        "opsctl.metrics.targets", "opsctl.audit.keynames", "opsctl.audit.keyspace", "opsctl.audit.nodechecks",
        "opsctl.audit.formats", "opsctl.backup.savers", "opsctl.backup.rdb", "opsctl.restore.route")
IO_LIBRARIES = {"redis", "socket", "select", "ssl", "subprocess", "paramiko", "ansible_runner", "threading",
                "concurrent", "hiredis", "asyncio"}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The opsctl module a dotted import name lands in (a name imported from a module lands in that module)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _relative_base(module: str, level: int) -> list[str]:
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    return base[: len(base) - (level - 1)]


@cache
def imports(module: str) -> frozenset[str]:
    """Every name module imports: libraries by their dotted name, opsctl modules resolved to the module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = ".".join([*_relative_base(module, node.level), *([source] if source else [])])
            names.add(source)
            names |= {f"{source}.{alias.name}" for alias in node.names}
    return frozenset(names)


@cache
def opsctl_imports(module: str) -> frozenset[str]:
    found = {_resolve(name) for name in imports(module) if name == "opsctl" or name.startswith("opsctl.")}
    return frozenset(m for m in found if m and m != module)


def package_of(module: str) -> str:
    """The room a module stands in: `opsctl` for the face, else its top-level package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "opsctl"


def is_pure(module: str) -> bool:
    """A PURE module, or the face of a PURE module's package that imports nothing (importing the module runs it)."""
    if module in PURE:
        return True
    return MODULES[module].name == "__init__.py" and any(p.startswith(module + ".") for p in PURE) \
        and not imports(module)


def room(module: str) -> str:
    """The room a module counts in: the planner's for a pure module outside the core, else its package."""
    return "plan" if is_pure(module) and package_of(module) not in CORE else package_of(module)


def rank(module: str) -> int:
    where = room(module)
    return -1 if where == "opsctl" else ORDER.index(where)


def test_every_module_stands_in_a_declared_package() -> None:
    stray = sorted(m for m in MODULES if package_of(m) not in (*ORDER, "opsctl"))
    assert not stray, f"modules outside the declared packages (add the package to ORDER or move them): {stray}"
    flat = sorted(m for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"
                  and m not in ("opsctl.__main__",))
    assert not flat, f"flat modules directly under opsctl/ (move each into its package): {flat}"


def test_imports_run_downhill() -> None:
    uphill = sorted(f"{m} imports {dep} ({room(dep)} stands after {room(m)})"
                    for m in MODULES for dep in opsctl_imports(m) if rank(dep) > rank(m))
    assert not uphill, "imports against the package order:\n" + "\n".join(uphill)


def test_the_face_imports_nothing_of_opsctl() -> None:
    assert not opsctl_imports("opsctl")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_cycles() -> None:
    graph = {m: set(opsctl_imports(m)) for m in MODULES}
    cycles = _cycles(graph)
    assert not cycles, "module cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_package_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for m in MODULES:
        graph.setdefault(room(m), set()).update(room(d) for d in opsctl_imports(m) if room(d) != room(m))
    cycles = _cycles(graph)
    assert not cycles, "package cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def io_reached(module: str) -> dict[str, str]:
    """Each I/O library the module reaches, directly or through opsctl modules, with the module that imports it."""
    found: dict[str, str] = {}
    seen, todo = {module}, [module]
    while todo:
        current = todo.pop()
        for name in imports(current):
            if name.split(".")[0] in IO_LIBRARIES:
                found.setdefault(name, current)
        for dep in opsctl_imports(current) - seen:
            seen.add(dep)
            todo.append(dep)
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if package_of(m) in CORE or m in PURE))
def test_the_core_reaches_no_io(module: str) -> None:
    reached = io_reached(module)
    assert not reached, f"{module} reaches I/O: " + ", ".join(f"{io} (imported by {by})" for io, by in reached.items())


def test_the_checks_see_what_they_look_for() -> None:
    assert "socket" in io_reached("opsctl.net.connector")
    assert rank("opsctl.cli.main") > rank("opsctl.net.connector") > rank("opsctl.plan.steps")
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def _loc(source: str) -> int:
    """Lines of code: lines holding a token other than a comment or a docstring (as /work/notes/i34-measure.py)."""
    tree = ast.parse(source)
    docs: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docs |= set(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines |= {n for n in range(token.start[0], token.end[0] + 1) if n not in docs}
    return len(lines)


FRAGMENT = 30  # lines of code: below this a module is a fragment of an idea that lives elsewhere


def test_no_fragments() -> None:
    """One idea per file: no module under FRAGMENT lines of code but a package face (`__init__.py`)."""
    small = sorted(f"{m} ({n} lines of code)" for m, p in MODULES.items()
                   if p.name != "__init__.py" and (n := _loc(p.read_text())) < FRAGMENT)
    assert not small, "fragments (merge each into the module of its idea, docs/architecture.md):\n" + "\n".join(small)


# File names two packages still share, each with the reason (issue 34 names the next step).
NAMES_SHARED = {
    "inventory.py": "cli/commands/inventory and scaffold both define register; providers/remote/inventory parses",
}


def test_one_name_per_idea() -> None:
    """No file name in two packages (faces excepted): a name says one concept, so one search finds it."""
    where: dict[str, list[str]] = {}
    for m, p in MODULES.items():
        if p.name != "__init__.py":
            where.setdefault(p.name, []).append(m)
    shared = sorted(f"{name}: {', '.join(sorted(ms))}" for name, ms in where.items()
                    if len(ms) > 1 and name not in NAMES_SHARED)
    assert not shared, "file names in more than one package (name each after its concept):\n" + "\n".join(shared)
    gone = sorted(name for name in NAMES_SHARED if len(where.get(name, [])) < 2)
    assert not gone, f"no longer shared, drop them from NAMES_SHARED: {gone}"


def test_pure_modules_exist() -> None:
    assert not [m for m in PURE if m not in MODULES], "PURE names a module that is not there"


# A running archiver re-places the connector it shares with its streams as the fleet's apply changes it (issue 33):
# the one view that moves on purpose while a command runs.
REPLACED_WHILE_RUNNING = {"backup/follow.py"}


def test_runtime_is_built_once() -> None:
    """The runtime is built over the placed spec (runtime.opening): nothing patches `.loaded` onto a provider or a
    connector after construction (a view for one step is Connector.over)."""
    patched = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in REPLACED_WHILE_RUNNING:
            continue
        tree = ast.parse(path.read_text())
        inits = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                 for n in ast.walk(f)}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign | ast.AugAssign) else []
            for target in (t for top in targets for t in ast.walk(top)):
                if isinstance(target, ast.Attribute) and target.attr == "loaded" and id(target) not in inits:
                    patched.append(f"{rel}:{target.lineno}")
    assert patched == []


def _asserts_step_type(node: ast.AST) -> bool:
    """`assert isinstance(step, …)`: a handler that takes any Step and narrows it itself."""
    test = node.test if isinstance(node, ast.Assert) else None
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance" \
        and bool(test.args) and isinstance(test.args[0], ast.Name) and test.args[0].id == "step"


def test_handlers_take_their_step_type() -> None:
    """A step handler takes its exact step type (runtime.execution.handles, checked by mypy): no
    `assert isinstance(step, …)` narrows a Step anywhere; the dispatch's one check is Handler.run_step."""
    found = sorted(f"{m}:{node.lineno}" for m, p in MODULES.items()
                   for node in ast.walk(ast.parse(p.read_text())) if _asserts_step_type(node))
    assert not found, "assert isinstance(step, ...) left (take the step type in the handler's def line):\n" \
        + "\n".join(found)
    assert _asserts_step_type(ast.parse("assert isinstance(step, StartNode)").body[0])


# The node handle (opsctl.net.connection) is the one door to a node: redis-py stays behind it (issue 34).
# Packages whose call sites move onto the handle in another branch (W6b); the lead empties this at merge.
NOT_YET: set[str] = set()
# `.client.` reaches that are not redis-py's: what each holds.
OTHER_CLIENTS = {"opsctl.backup.s3": "boto3's S3 client (self.client.meta, .head_bucket, ...)"}


def _redis_reaches(tree: ast.AST) -> list[str]:
    """`import redis`/`from redis…`, `except redis.X` (alone or in a tuple) and `x.client.y` (a reach through a
    wrapper into redis-py), each as `line: what`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "redis" for a in node.names):
            found.append(f"{node.lineno}: import redis")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "redis":
            found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.ExceptHandler) and node.type is not None and any(
                isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "redis"
                for n in ast.walk(node.type)):
            found.append(f"{node.lineno}: except redis.")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "client":
            found.append(f"{node.lineno}: .client.{node.attr}")
    return found


def test_redis_only_in_net() -> None:
    """Outside opsctl/net/ no module imports redis-py, catches its errors (`except NodeError`: NodeUnreachable or
    NodeRefused, opsctl.base.errors) or reaches through `.client.` into it: every node call goes through the node
    handle, opsctl.net.connection.Connection."""
    reaches = sorted(f"{m}:{where}" for m, p in MODULES.items()
                     if package_of(m) not in {"net", *NOT_YET}
                     for where in _redis_reaches(ast.parse(p.read_text()))
                     if not (m in OTHER_CLIENTS and ".client." in where))
    assert not reaches, "redis-py outside opsctl.net (use the node handle, opsctl.net.connection):\n" + \
        "\n".join(reaches)
    assert len(_redis_reaches(ast.parse(
        "import redis.crc\nfrom redis import Redis\ntry:\n    pass\nexcept (OSError, redis.ResponseError):\n    pass\n"
        "admin.client.ping()\n"))) == 4
    assert not [m for m in OTHER_CLIENTS if m not in MODULES], "OTHER_CLIENTS names a module that is not there"
