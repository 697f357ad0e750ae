"""Files opsctl writes and reads back, safe when it runs as root.

Never write through a symbolic link (the folder is opened with O_NOFOLLOW, the temp file is created with
O_EXCL|O_NOFOLLOW inside it and renamed over the target), never trust a folder someone else owns, never read
more than a bounded amount, and say which file is wrong and how to fix it when one is.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from opsctl.base.errors import OpsctlError
from opsctl.base.events import human_bytes

READ_LIMIT = 16 * 1024 * 1024
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
LINK_HINT = ("opsctl never writes through a symbolic link (it reads through one only when the command line names it): "
             "give the real path (`realpath LINK` names it), or remove the link")


class FileProblem(OpsctlError):
    """A file or folder opsctl reads or writes is not what it should be: `<path>: what is wrong`."""

    def __init__(self, path: Path | str, what: str, hint: str) -> None:
        super().__init__(f"{path}: {what}", hint=hint)
        self.path = str(path)


def free_bytes(folder: Path | str) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of folder (None when it cannot be asked)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(path: Path | str, exc: OSError, needed: int | None, what: str = "",
              about: bool = False) -> FileProblem | None:
    """The FileProblem for a write that failed because path's file system is full (ENOSPC) or the user's quota is
    spent (EDQUOT): which folder, the free space there and the space needed; None for any other error."""
    if exc.errno not in FULL_ERRNOS:
        return None
    folder = Path(path).parent
    free = free_bytes(folder)
    cause = "the disk is full" if exc.errno == errno.ENOSPC else "the disk quota is used up"
    need = f", {'about ' if about else ''}{human_bytes(needed)} needed" if needed is not None else ""
    return FileProblem(path, f"cannot be written{what}: {cause} where {folder} is ("
                       f"{'unknown' if free is None else human_bytes(free)} free{need})",
                       f"free space there (`df -h {folder}`), or point opsctl at a folder on another disk, "
                       "then run the same command again")


def trusted_owners(extra: Iterable[int] = ()) -> frozenset[int]:
    """Who may own the folders opsctl trusts: the user running it, root, and any server user it runs as."""
    return frozenset({os.geteuid(), 0, *extra})


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_dir_stat(path: Path | str, st: os.stat_result, owners: frozenset[int] | None,
                   hint: str = "move it away, or choose another --state-dir", link_hint: str = LINK_HINT) -> None:
    """A folder opsctl writes into: not a link, a folder, owned by owners (None: anyone); hint: for a non-folder,
    link_hint: for a link."""
    if stat.S_ISLNK(st.st_mode):
        raise FileProblem(path, "is a symbolic link, not a folder", link_hint)
    if not stat.S_ISDIR(st.st_mode):
        raise FileProblem(path, "is not a folder", hint)
    if owners is not None and st.st_uid not in owners:
        raise FileProblem(path, f"is owned by {_owner_name(st.st_uid)}, not by {_owner_name(os.geteuid())}",
                          "someone else controls this folder: check who made it, or choose another --state-dir")


def check_state_path(path: Path, below: Path | None = None, owners: frozenset[int] | None = None) -> None:
    """Refuse a state folder (and every folder of it below `below`) that is a link, not a folder, or foreign-owned.

    Folders that do not exist yet are fine: opsctl creates them itself (make_dir)."""
    owners = trusted_owners() if owners is None else owners
    chain = [path]
    if below is not None:
        chain = [p for p in [path, *path.parents] if below in p.parents]
    for folder in reversed(chain):
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise FileProblem(folder, f"cannot be inspected: {exc.strerror}", "check its permissions") from None
        check_dir_stat(folder, st, owners)


@contextmanager
def open_dir(path: Path, owners: frozenset[int] | None = None) -> Iterator[int]:
    """An fd of the folder itself (O_NOFOLLOW: never a link's target), checked, closed after the block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FileProblem(path, "is a symbolic link or not a folder", LINK_HINT) from None
        raise FileProblem(path, f"cannot be opened: {exc.strerror}", "check the path and its permissions") from None
    try:
        check_dir_stat(path, os.fstat(fd), owners)
        yield fd
    finally:
        os.close(fd)


def make_dir(path: Path, mode: int = 0o700, owners: frozenset[int] | None = None,
             chown: tuple[int, int] | None = None, enforce: bool = True) -> None:
    """Create the folder (and missing parents) if needed; refuse a link or a foreign folder; set its mode
    (on an existing folder only when enforce)."""
    created = False
    try:
        os.lstat(path)
    except FileNotFoundError:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with suppress(FileExistsError):
                os.mkdir(path, mode)
                created = True
        except OSError as exc:
            if (problem := disk_full(path, exc, None)) is not None:
                raise problem from None
            raise
    except OSError as exc:
        raise FileProblem(path, f"cannot be inspected: {exc.strerror}", "check its permissions") from None
    with open_dir(path, owners) as fd:
        if chown is not None:
            os.fchown(fd, *chown)
        if created or enforce:
            os.fchmod(fd, mode)


def write_private(path: Path, text: str | bytes, chown: tuple[int, int] | None = None, mode: int = 0o600) -> None:
    """Create or replace path with mode 0600 from the first byte on, never through a link.

    The folder is opened without following a link, the temp file is new (O_EXCL|O_NOFOLLOW) and renamed over
    the target inside that folder: a link planted at the target or at a temp name only ever gets replaced."""
    path = Path(path)
    _make_parents(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        _write_new(path, data, chown, mode)
    except OSError as exc:
        if (problem := disk_full(path, exc, len(data))) is not None:
            raise problem from None
        raise


def rewrite_open(fd: int, path: Path | str, data: bytes) -> None:
    """Replace the content of a file opsctl holds open (a lock file's holder) with data; a full disk is a
    FileProblem naming it, as for write_private."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError as exc:
        if (problem := disk_full(path, exc, len(data))) is not None:
            raise problem from None
        raise


def append_private(path: Path, data: bytes, hint: str, mode: int = 0o600) -> None:
    """Append data to path (created 0600) and fsync it, all or nothing: never through a link, never to a fifo,
    device or folder; a write that fails (a full disk: said as such) is cut back off, so no torn line stays."""
    path = Path(path)
    with open_dir(path.parent) as folder:
        fd = _open_append(path, folder, mode, hint)
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, data)
                os.fsync(fd)
            except OSError as exc:
                with suppress(OSError):
                    os.ftruncate(fd, size)
                raise disk_full(path, exc, len(data)) or FileProblem(
                    path, f"cannot be written: {exc.strerror}", hint) from None
        finally:
            os.close(fd)


def _open_append(path: Path, folder: int, mode: int, hint: str) -> int:
    """An fd appending to the regular file path.name in folder (O_NONBLOCK: a fifo planted there never blocks)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path.name, flags, mode, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileProblem(path, "is a symbolic link", LINK_HINT) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise FileProblem(path, "exists and is not a regular file", hint) from None
        raise disk_full(path, exc, None) or FileProblem(path, f"cannot be written: {exc.strerror}", hint) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileProblem(path, "exists and is not a regular file", hint)
    return fd


def write_all(fd: int, data: bytes) -> None:
    """All of data to fd (os.write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_new(path: Path, data: bytes, chown: tuple[int, int] | None, mode: int) -> None:
    with open_dir(path.parent) as folder:
        _refuse_odd_target(path, folder)
        # os.urandom, as secrets.token_hex does, without that module's imports (random, base64) in every run
        tmp = f".{path.name}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(fd, mode)
                if chown is not None:
                    os.fchown(fd, *chown)
                handle.write(data)
                handle.flush()
                os.fsync(fd)  # the content is on disk before the name points at it
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
            os.fsync(folder)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise


def _make_parents(path: Path) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        if (problem := disk_full(path.parent, exc, None)) is not None:
            raise problem from None
        where = next((p for p in [path.parent, *path.parent.parents] if p.exists() and not p.is_dir()), path.parent)
        what = "is not a folder" if where.exists() else f"cannot be created: {exc.strerror}"
        raise FileProblem(where, what, f"move it away, or write {path.name} somewhere else") from None


def _refuse_odd_target(path: Path, folder: int) -> None:
    try:
        st = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    check_file_stat(path, st)


def check_file_stat(path: Path | str, st: os.stat_result,
                    hint: str = "give the path of a file (or a new name)") -> None:
    """A file opsctl replaces: not a link (never written through), a regular file; hint: for anything else."""
    if stat.S_ISLNK(st.st_mode):
        raise FileProblem(path, "is a symbolic link", LINK_HINT)
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(path, "exists and is not a regular file", hint)


def check_writable_target(path: Path | str, what: str) -> None:
    """Up-front check of an output path (--out, --report): its folder exists, it is not a link or a folder."""
    target = Path(path)
    hint = f"give {what} the path of a new or regular file in an existing folder"
    if not target.name or target.name in (".", ".."):
        raise FileProblem(target, "is not a file name", hint)
    parent = target.parent
    if parent.is_symlink():
        raise FileProblem(parent, "is a symbolic link", LINK_HINT + f", or give {what} the real folder")
    if not parent.is_dir():
        raise FileProblem(target, f"its folder {parent} does not exist", hint)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FileProblem(target, f"its folder {parent} is not writable", hint)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise FileProblem(target, "is a symbolic link", LINK_HINT)
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(target, "exists and is not a regular file", hint)


def check_writable_folder(path: Path | str, hint: str, missing_ok: bool = False) -> None:
    """Up-front check of an output folder (--to DIR, --metrics-textfile DIR): a folder, not a link, writable; one
    that does not exist is refused, or with missing_ok its nearest existing parent must be such a folder (opsctl
    creates the rest)."""
    folder = Path(path)
    while missing_ok and not os.path.lexists(folder) and folder.parent != folder:
        folder = folder.parent
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise FileProblem(folder, "does not exist", hint) from None
    except OSError as exc:
        raise FileProblem(folder, f"cannot be inspected: {exc.strerror}", hint) from None
    if stat.S_ISLNK(st.st_mode):  # the link could be turned to another folder between the check and the write
        raise FileProblem(folder, "is a symbolic link, not a folder",
                          f"give the folder itself (`realpath {folder}` names it), not a link to it")
    if not stat.S_ISDIR(st.st_mode):
        raise FileProblem(folder, "is not a folder", hint)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FileProblem(folder, "is not writable by this user", hint)


def _open_regular(path: Path | str, hint: str, follow: bool = False) -> tuple[int, os.stat_result] | None:
    """An fd of a regular file and its stat, None when it does not exist; never a link unless follow, never a
    folder, fifo or device (O_NONBLOCK: opening a fifo does not wait for a writer)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileProblem(path, "is a symbolic link", LINK_HINT) from None
        raise FileProblem(path, f"cannot be read: {exc.strerror}", hint) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FileProblem(path, "is a folder, not a file" if stat.S_ISDIR(st.st_mode) else "is not a regular file",
                          hint)
    return fd, st


@contextmanager
def open_regular(path: Path | str, hint: str) -> Iterator[tuple[BinaryIO, int]]:
    """(the file open for reading, its size): a regular file read through no link, checked on the open file
    itself, so a file swapped for a link after a check is never followed; a FileProblem naming it otherwise."""
    opened = _open_regular(path, hint)
    if opened is None:
        raise FileProblem(path, "is missing", hint)
    fd, st = opened
    with os.fdopen(fd, "rb") as handle:
        yield handle, st.st_size


def read_bounded(path: Path | str, hint: str, limit: int = READ_LIMIT, follow: bool = False) -> str | None:
    """A text file's content, None when it does not exist. A link (unless follow), a folder, a device, an
    unreadable, oversized or non-UTF-8 file is a FileProblem naming the file, with hint saying how to fix it."""
    opened = _open_regular(path, hint, follow)
    if opened is None:
        return None
    fd, st = opened
    with os.fdopen(fd, "rb") as handle:
        if st.st_size > limit:
            raise FileProblem(path, f"is too big ({st.st_size} bytes, at most {limit})", hint)
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise FileProblem(path, f"cannot be read: {exc.strerror}", hint) from None
    if len(data) > limit:
        raise FileProblem(path, f"is too big (more than {limit} bytes)", hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(path, f"is not UTF-8 text (byte {exc.start})", hint) from None
