"""The S3 store through boto3 (the `s3` extra, imported only when an s3:// URL is given). Endpoint, region and
credentials come from boto3's usual configuration (AWS_ENDPOINT_URL, AWS_PROFILE, ~/.aws), never from opsctl's
command line; big files go up in parts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.backup.store import LIMIT, Location, check_name
from opsctl.base.errors import OpsctlError

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig

EXTRA = "opsctl-redis[s3]"
PART = 64 << 20
HINT = ("check the endpoint, region and credentials boto3 reads (AWS_ENDPOINT_URL, AWS_PROFILE, ~/.aws/config) "
        "and that the bucket exists and this identity may use it")


def transfer_config(part: int = PART) -> TransferConfig:
    """Parts of `part` bytes above `part` bytes, four in flight."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=4)


@contextmanager
def _answered(what: str) -> Iterator[None]:
    """boto3's errors as an OpsctlError naming the object; its text names codes and endpoints, never a secret."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise OpsctlError(f"{what}: {error.get('Code', '?')} {error.get('Message', '')}".rstrip(),
                          hint=HINT) from None
    except BotoCoreError as exc:
        raise OpsctlError(f"{what}: {type(exc).__name__}: {exc}", hint=HINT) from None


class S3Store:
    """A bucket prefix. Objects are written whole (a PUT, or a multipart upload completed at once)."""

    def __init__(self, location: Location, transfer: TransferConfig | None = None) -> None:
        self.location, self.bucket, self.prefix = location, location.bucket, location.prefix
        try:
            import boto3
        except ImportError:
            raise OpsctlError("s3:// locations need boto3, which is not installed",
                              hint=f"pip install '{EXTRA}' (or pip install boto3), or use a folder") from None
        self.client = boto3.session.Session().client("s3")  # typed by boto3-stubs (dev) as the S3 client
        self.transfer = transfer or transfer_config()

    def key(self, name: str) -> str:
        check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    def where(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    def put_file(self, name: str, path: Path) -> None:
        with _answered(f"cannot upload {self.where(name)}"):
            self.client.upload_file(str(path), self.bucket, self.key(name), Config=self.transfer)

    def put_bytes(self, name: str, data: bytes) -> None:
        with _answered(f"cannot upload {self.where(name)}"):
            self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def get_file(self, name: str, dest: Path) -> None:
        with _answered(f"cannot download {self.where(name)}"):
            self.client.download_file(self.bucket, self.key(name), str(dest), Config=self.transfer)

    def get_bytes(self, name: str, limit: int = LIMIT) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            with _answered(f"cannot download {self.where(name)}"):
                reply = self.client.get_object(Bucket=self.bucket, Key=self.key(name))
                data = reply["Body"].read(limit + 1)
        except OpsctlError as exc:
            cause = exc.__context__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") == "NoSuchKey":
                return None
            raise
        if len(data) > limit:
            raise OpsctlError(f"{self.where(name)} is too big (more than {limit} bytes)", hint="use another backup")
        return data

    def names(self, prefix: str = "") -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        out: list[str] = []
        with _answered(f"cannot list s3://{self.bucket}/{base}{prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                out += [item["Key"][len(base):] for item in page.get("Contents", []) if "Key" in item]
        return sorted(out)

    def delete(self, names: list[str]) -> None:
        for start in range(0, len(names), 1000):
            batch = [{"Key": self.key(n)} for n in names[start:start + 1000]]
            with _answered(f"cannot delete objects under s3://{self.bucket}/{self.prefix}"):
                reply = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})  # type: ignore[typeddict-item]
            if reply.get("Errors"):
                first = reply["Errors"][0]
                raise OpsctlError(f"cannot delete s3://{self.bucket}/{first.get('Key')}: {first.get('Code')}",
                                  hint=HINT)
