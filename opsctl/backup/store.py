"""Where backups live: a folder, or an S3-compatible bucket prefix (`s3://bucket/prefix`), behind one small
interface of objects by relative name. Names and contents carry no secret: credentials stay in boto3's own
configuration."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from opsctl.base.errors import OpsctlError, echo
from opsctl.base.secrets import mask_url, userinfo_end
from opsctl.state.safefs import FileProblem, check_writable_folder, read_bounded, write_private

S3 = "s3://"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")  # `s4://`, `S3:/`, `file:/`: a URL, never a folder's name
LOCATION_HINT = "write s3://BUCKET/PREFIX (lower-case s3, two slashes), or a folder path (./name for a folder " \
                "whose name holds a colon)"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]*$")
LIMIT = 64 << 20


@dataclass(frozen=True)
class Location:
    """A parsed --to/--from: a folder, or a bucket with a key prefix (no leading or trailing slash)."""

    text: str
    folder: Path | None = None
    bucket: str = ""
    prefix: str = ""

    @property
    def remote(self) -> bool:
        return self.folder is None

    def child(self, name: str) -> Location:
        """The location of one backup inside this one."""
        if self.folder is not None:
            return Location(str(self.folder / name), self.folder / name)
        prefix = f"{self.prefix}/{name}" if self.prefix else name
        return Location(f"{S3}{self.bucket}/{prefix}", None, self.bucket, prefix)


def parse_location(text: str) -> Location:
    """`s3://bucket[/prefix]` or a folder path; an s3 URL with a bad bucket or empty path parts is refused, and so
    is any other scheme (`s4://`, `S3:/`, `s3:/bucket`, `file:/`): a typo must not become a local folder."""
    if not text.strip():
        raise OpsctlError("the location is empty", hint=LOCATION_HINT)
    if text != text.strip():  # ' s3://b' would be a folder named so; a blank at the end, a folder nobody meant
        raise OpsctlError(f"{echo(text)}: the location starts or ends with a blank", hint=LOCATION_HINT)
    if text.lower().startswith(("s3/", "s3\\")):  # `s3//bucket`: a mistyped scheme, never a folder named s3
        raise OpsctlError(f"{echo(text)}: a mistyped s3:// (a folder named s3 is written ./s3/...)",
                          hint=LOCATION_HINT)
    if not text.startswith(S3):
        if _SCHEME.match(text):
            scheme = text.partition(":")[0]
            raise OpsctlError(f"{echo(mask_url(text))}: {echo(scheme + ':')} is not a location scheme opsctl knows",
                              hint=LOCATION_HINT)
        return Location(text, Path(text))
    if userinfo_end(text, len(S3)) > len(S3):  # said before any part of it is echoed: a part may be a secret's
        raise OpsctlError(f"{echo(text)}: an s3:// location holds no user, key or password",
                          hint="write s3://BUCKET/PREFIX; boto3 takes the credentials from AWS_* or ~/.aws")
    bucket, _, prefix = text[len(S3):].partition("/")
    prefix = prefix.strip("/")
    if not _BUCKET.match(bucket):
        raise OpsctlError(f"{echo(mask_url(text))}: {echo(mask_url(S3 + bucket)[len(S3):])} is not an S3 bucket name",
                          hint="write s3://BUCKET/PREFIX (a bucket name is 3-63 lower-case letters, digits, . or -)")
    if prefix and (not _NAME.match(prefix) or "//" in prefix or any(p in (".", "..") for p in prefix.split("/"))):
        raise OpsctlError(f"{echo(mask_url(text))}: the prefix {echo(mask_url(text)[len(S3) + len(bucket) + 1:])} has "
                          "characters or parts opsctl does not write",
                          hint="use letters, digits, '.', '_', '-' and single '/' between parts")
    return Location(text, None, bucket, prefix)


def check_name(name: str) -> str:
    """A relative object name opsctl writes: no empty, '.' or '..' part, nothing a shell or a store treats oddly."""
    if not _NAME.match(name) or "//" in name or any(p in (".", "..") for p in name.split("/")):
        raise OpsctlError(f"{echo(name)} is not an object name opsctl writes")
    return name


class Store(Protocol):
    """Objects by relative name. put_* replaces whole objects (a reader sees the old or the new one, never half);
    names() lists every object under a name prefix, sorted."""

    location: Location

    def probe(self, writing: bool) -> None:
        """Before any work: the location answers, exists (or, writing, can be made) and takes a write when
        writing; a clear error naming it otherwise."""
        ...

    def put_file(self, name: str, path: Path) -> None: ...

    def put_bytes(self, name: str, data: bytes) -> None: ...

    def get_file(self, name: str, dest: Path) -> None: ...

    def get_bytes(self, name: str, limit: int = LIMIT) -> bytes | None: ...

    def names(self, prefix: str = "") -> list[str]: ...

    def delete(self, names: list[str]) -> None: ...

    def where(self, name: str) -> str: ...


class FolderStore:
    """A folder on this machine: objects are 0600 files (written through a temp file and renamed) in 0700 folders."""

    def __init__(self, location: Location) -> None:
        assert location.folder is not None
        self.location, self.root = location, location.folder

    def _path(self, name: str) -> Path:
        return self.root / check_name(name)

    def probe(self, writing: bool) -> None:
        if writing:
            check_writable_folder(self.root, "give --to a folder opsctl may write (it is created when missing)",
                                  missing_ok=True)
        elif not self.root.is_dir():
            raise OpsctlError(f"no backup at {self.root}: it {_not_a_folder(self.root)}",
                              hint="give the folder backups went to (`backup --to DIR`)")

    def put_file(self, name: str, path: Path) -> None:
        self.put_bytes(name, path.read_bytes())

    def put_bytes(self, name: str, data: bytes) -> None:
        path = self._path(name)
        for folder in reversed([p for p in path.parents if p.is_relative_to(self.root)]):
            folder.mkdir(mode=0o700, exist_ok=True)  # each level 0700 (mkdir(parents=True) leaves them 0755)
        write_private(path, data)

    def get_file(self, name: str, dest: Path) -> None:
        with open(self._path(name), "rb") as src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)

    def get_bytes(self, name: str, limit: int = LIMIT) -> bytes | None:
        path = self._path(name)
        if not path.exists():
            return None
        if path.is_symlink() or not path.is_file():
            raise FileProblem(path, "is not a plain file", "a backup holds plain files and never links")
        if path.stat().st_size > limit:
            raise FileProblem(path, f"is too big (at most {limit} bytes)", "use another backup")
        return path.read_bytes()

    def read_text(self, name: str) -> str | None:
        return read_bounded(self._path(name), "use another backup")

    def names(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(n for n in _walk(self.root, "") if n.startswith(prefix))

    def delete(self, names: list[str]) -> None:
        for name in names:
            path = self._path(name)
            path.unlink(missing_ok=True)
            for parent in path.parents:  # folders left empty go too, up to the root
                if parent == self.root or not parent.is_relative_to(self.root):
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break

    def where(self, name: str) -> str:
        return str(self.root / name)


def _not_a_folder(path: Path) -> str:
    return "is not a folder" if path.exists() else "does not exist"


def _walk(root: Path, under: str) -> Iterator[str]:
    for entry in os.scandir(root / under if under else root):
        name = f"{under}/{entry.name}" if under else entry.name
        if entry.name.startswith("."):
            continue  # a .partial backup in the making, a temp file: not an object
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(root, name)
        elif entry.is_file(follow_symlinks=False):
            yield name
