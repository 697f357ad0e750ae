"""The local provider's files: each node owns `<state_dir>/<node>/` (0700): its config (0600, the only place
with the password), users.acl, log, pidfile, data, and opsctl's record.

Folders must be opsctl's (or root's), never followed through a link; files go through safefs. Run as root,
servers run as serveruser's user, who owns the node folders and what a server rewrites; the record stays root's.

The OS user local servers run as when opsctl runs as root: never root (the servers' own docs say so).

`server.user` in the spec, by default the flavor's name (`valkey` or `redis`, as the Ansible provider uses),
created as a system user without a login shell when missing. When opsctl does not run as root the servers
run as opsctl's own user, as before."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from opsctl.base.errors import OpsctlError
from opsctl.providers.base import parse_record, record_text
from opsctl.providers.binaries import ServerBinary
from opsctl.render import NodePaths, default_paths
from opsctl.spec.deployed import NodeRecord, is_node_name
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import check_state_path, make_dir, read_bounded, trusted_owners, write_private

RECORD = "opsctl-node.json"
FLAVOR_USERS = ("valkey", "redis")  # server.user's defaults
RECORD_LIMIT = 1024 * 1024
READ_HINT = "the node's folder holds only what opsctl and the server wrote: remove the odd entry and run apply"


def read_text(path: Path, limit: int = RECORD_LIMIT) -> str | None:
    """A node file's text (None when missing); a link, a folder, a huge or unreadable file is a FileProblem."""
    return read_bounded(path, READ_HINT, limit)


def plain_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise OpsctlError(f"not a plain file name: {name!r}", hint="node files live directly in the node's folder")
    return name


def deployed_records_in(loaded: LoadedSpec, state_dir: Path) -> dict[str, NodeRecord]:
    """The records of the spec's server folders in the state dir (<spec>-<k>/opsctl-node.json): this machine is
    every host, and its nodes live there (Provider.deployed_records; also read without a provider)."""
    spec = loaded.spec
    state_dir = Path(os.path.abspath(state_dir))
    if spec.topology == "standalone" or not state_dir.is_dir():
        return {}
    found: dict[str, NodeRecord] = {}
    for entry in sorted(os.listdir(state_dir)):
        folder = state_dir / entry
        if not is_node_name(spec, entry) or folder.is_symlink() or not folder.is_dir():
            continue
        path = folder / RECORD
        record = parse_record(read_text(path), str(path))
        if record:
            found[entry] = record
    return found


def empty_but_record(folder: Path) -> None:
    """Delete everything in a node's folder but its record (a retired node's tombstone, written first: a run killed
    part way leaves the record, so the name is never given again). Links are removed, never followed."""
    if not folder.is_dir():
        return
    for entry in os.scandir(folder):
        if entry.name == RECORD:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


class LocalFiles:
    """The node folders of a spec's local servers, their files and opsctl's records; who owns them."""

    def __init__(self, loaded: LoadedSpec, state_dir: Path, binary: ServerBinary) -> None:
        self.loaded = loaded
        self.state_dir = Path(os.path.abspath(state_dir))  # never resolved: a link in it is refused, not followed
        self.binary = binary
        self._user: ServerUser | None = None

    def node_dir(self, node: Node) -> Path:
        return self.state_dir / node.name

    def paths(self, node: Node) -> NodePaths:
        return default_paths(str(self.state_dir), node)

    def server_user(self) -> ServerUser | None:
        """Who the servers run as: None (opsctl's own user) unless opsctl is root; created when missing."""
        if os.geteuid() != 0:
            return None
        if self._user is None:
            user = ensure(self.loaded.spec.server.service_user)
            check_reachable(user, self.state_dir)  # before the first file is written
            self._user = user
            self.binary = self._runnable_binary(user)
            check_reachable(user, self.state_dir, self.binary.path)
        return self._user

    def _runnable_binary(self, user: ServerUser) -> ServerBinary:
        """The binary, or a copy of it in the state dir's bin/ when it lies where the server user cannot enter
        (the embedded server in a virtualenv under root's 0700 home): same bytes, root's, 0755."""
        if can_run(user, self.binary.path):
            return self.binary
        source = Path(self.binary.path)
        copy = self.state_dir / "bin" / source.name
        data = source.read_bytes()
        make_dir(self.state_dir, 0o711, trusted_owners())
        make_dir(copy.parent, 0o711, trusted_owners())
        if not _same_file(copy, data):
            write_private(copy, data, mode=0o755)
        return replace(self.binary, path=str(copy))

    def _owners(self) -> frozenset[int]:
        """Who may own a node folder: opsctl's user, root, and the server user (looked up, never created), or
        the other flavor's default user (a folder from before a flavor change; start hands it over)."""
        if os.geteuid() != 0:
            return trusted_owners()
        names = {self.loaded.spec.server.service_user, *FLAVOR_USERS}
        return trusted_owners(user.uid for name in names if (user := lookup(name)) is not None)

    def _folder(self, node: Node, hand_over: bool = False) -> Path:
        """The node's folder, made the server user's when missing. One that exists keeps its owner until the server
        starts (hand_over). Why: a spec that changes the server user writes the new files while the old server,
        still running as the old user, must go on writing there (log, AOF, nodes.conf, its last RDB)."""
        user = self.server_user()
        check_state_path(self.state_dir, owners=trusted_owners())
        make_dir(self.state_dir, 0o711 if user else 0o700, trusted_owners())
        folder = self.node_dir(node)
        new = not os.path.lexists(folder)
        make_dir(folder, 0o700, self._owners(), chown=user.ids if user and (new or hand_over) else None)
        return folder

    def _checked_node_dir(self, node: Node) -> Path:
        """The node's folder, refused when it (or the state dir) is a link or someone else's."""
        folder = self.node_dir(node)
        check_state_path(folder, below=self.state_dir.parent, owners=self._owners())
        return folder

    def write_files(self, node: Node, files: dict[str, str]) -> None:
        """The files are the folder owner's (the running server's, which may rewrite its config) until the server
        starts as the spec's user (_hand_over)."""
        names = [plain_name(name) for name in files]
        folder = self._folder(node)
        owner = os.stat(folder) if self.server_user() else None
        for name in names:
            write_private(folder / name, files[name], chown=(owner.st_uid, owner.st_gid) if owner else None)

    def _hand_over(self, node: Node, user: ServerUser) -> None:
        """Give the server user what it writes in its folder (data, logs, configs of an earlier root run);
        opsctl's record stays root's. Links are changed themselves, never followed, and a file with a second
        hard link is left alone (it could be any file of the system, planted to be handed over)."""
        folder = self._folder(node, hand_over=True)
        for root, dirs, names in os.walk(folder):
            for name in [*dirs, *names]:
                path = os.path.join(root, name)
                st = os.lstat(path)
                hard_linked = stat.S_ISREG(st.st_mode) and st.st_nlink > 1
                if name != RECORD and st.st_uid != user.uid and not hard_linked:
                    os.chown(path, *user.ids, follow_symlinks=False)

    def read_file(self, node: Node, name: str) -> str | None:
        return read_text(self._checked_node_dir(node) / plain_name(name))

    def load_record(self, node: Node) -> NodeRecord:
        path = self._checked_node_dir(node) / RECORD
        return parse_record(read_text(path), str(path))

    def deployed_records(self) -> dict[str, NodeRecord]:
        return deployed_records_in(self.loaded, self.state_dir)

    def save_record(self, node: Node, record: NodeRecord) -> None:
        write_private(self._folder(node) / RECORD, record_text(record))

    def _drop_binary_copy_when_unused(self) -> None:
        """The state dir's bin/ (_runnable_binary's copy) goes with the last node folder of the spec."""
        if any(self.node_dir(n).exists() for n in self.loaded.layout.nodes):
            return
        copies = self.state_dir / "bin"
        if copies.is_dir() and not copies.is_symlink():
            shutil.rmtree(copies)

    def flush(self) -> None:
        """Files are written at once: nothing is staged."""


def _same_file(path: Path, data: bytes) -> bool:
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as handle:
            return handle.read(len(data) + 1) == data
    except OSError:
        return False


CREATE_ATTEMPTS = 5
NOLOGIN = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false")


@dataclass(frozen=True)
class ServerUser:
    name: str
    uid: int
    gid: int

    @property
    def ids(self) -> tuple[int, int]:
        return self.uid, self.gid


def lookup(name: str) -> ServerUser | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return ServerUser(name, entry.pw_uid, entry.pw_gid)


def _create_command(name: str) -> list[str]:
    shell = next((s for s in NOLOGIN if os.path.exists(s)), "/bin/false")
    if shutil.which("useradd"):
        return ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                "--shell", shell, name]
    if shutil.which("adduser"):  # BusyBox/Alpine
        return ["adduser", "-S", "-D", "-H", "-h", "/nonexistent", "-s", shell, name]
    raise OpsctlError(f"cannot create the server user {name!r}: neither useradd nor adduser is installed",
                      hint=f"create the user {name!r} yourself, or set server.user to an existing user")


def ensure(name: str) -> ServerUser:
    """The user, created (system user, no login, no home) if missing. Tolerates a parallel run creating it."""
    last = ""
    for _ in range(CREATE_ATTEMPTS):
        if (user := lookup(name)) is not None:
            return _not_root(user)
        done = subprocess.run(_create_command(name), capture_output=True, text=True, check=False,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0 and lookup(name) is None:
            last = (done.stderr or done.stdout).strip()
            time.sleep(0.2)  # /etc/passwd may be locked by a parallel useradd
    user = lookup(name)
    if user is None:
        raise OpsctlError(f"cannot create the server user {name!r}", last,
                          f"create the user {name!r} yourself, or set server.user to an existing user")
    return _not_root(user)


def _not_root(user: ServerUser) -> ServerUser:
    if user.uid == 0:
        raise OpsctlError(f"server.user {user.name!r} is root: servers never run as root",
                          hint="set server.user to an unprivileged user (default: the flavor's name)")
    return user


def may_enter(st: os.stat_result, user: ServerUser, bit_user: int, bit_group: int, bit_other: int) -> bool:
    if st.st_uid == user.uid:
        return bool(st.st_mode & bit_user)
    if st.st_gid == user.gid:
        return bool(st.st_mode & bit_group)
    return bool(st.st_mode & bit_other)


def blocked_folder(path: Path, user: ServerUser) -> Path | None:
    """The first existing folder on the way to path that user cannot pass through (no x bit), or None."""
    for folder in reversed([path, *path.parents]):
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(st.st_mode) and not may_enter(st, user, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return folder
    return None


def check_reachable(user: ServerUser, state_dir: Path, binary: str | None = None) -> None:
    """Refuse before anything starts when the server user could not reach its folder (or run binary, when
    given). The state dir itself is opsctl's to open (0711); the folders above it are the operator's."""
    hint = ("let it through (`chmod o+x {0}`), choose a --state-dir it can reach, or set server.user to a user "
            "that can")
    folder = blocked_folder(state_dir.parent, user)
    if folder is not None:
        raise OpsctlError(f"the server user {user.name} cannot reach {state_dir}: {folder} is closed to it",
                          f"{folder} has mode {stat.S_IMODE(os.stat(folder).st_mode):04o}", hint.format(folder))
    if binary is None or can_run(user, binary):
        return
    where = blocked_folder(Path(binary).parent, user) or Path(binary)
    raise OpsctlError(f"the server user {user.name} cannot run {binary}: {where} is closed to it",
                      hint=hint.format(where).replace("o+x", "o+rx" if where == Path(binary) else "o+x"))


def can_run(user: ServerUser, binary: str) -> bool:
    program = Path(binary)
    return (blocked_folder(program.parent, user) is None
            and may_enter(os.stat(program), user, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH))
