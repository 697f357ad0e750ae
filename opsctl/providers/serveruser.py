"""The OS user local servers run as when opsctl runs as root: never root (the servers' own docs say so).

`server.user` in the spec, by default the flavor's name (`valkey` or `redis`, as the Ansible provider uses),
created as a system user without a login shell when missing. When opsctl does not run as root the servers
run as opsctl's own user, as before.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from opsctl.base.errors import OpsctlError

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
