"""The S3 store through boto3 (the `s3` extra, imported only when an s3:// URL is given). Endpoint, region and
credentials come from boto3's usual configuration (AWS_ENDPOINT_URL, AWS_PROFILE, ~/.aws), never from opsctl's
command line; big files go up in parts."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.backup.store import LIMIT, Location, check_name
from opsctl.base.errors import OpsctlError, echo
from opsctl.base.record import ascii_decimal
from opsctl.base.secrets import Secret, mask_url, remember, userinfo_end
from opsctl.spec.layout import valid_host, valid_port

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig

EXTRA = "opsctl-redis[s3]"
PART = 64 << 20
PROBE = "opsctl-probe"  # written and deleted before a backup: the bucket takes writes from this identity
HINT = ("check the endpoint, region and credentials boto3 reads (AWS_ENDPOINT_URL, AWS_PROFILE, ~/.aws/config) "
        "and that the bucket exists and this identity may use it")


def transfer_config(part: int = PART) -> TransferConfig:
    """Parts of `part` bytes above `part` bytes, four in flight."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=4)


_ENDPOINT = "check the endpoint boto3 reads (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, endpoint_url in ~/.aws/config): " \
    "the S3 service must answer there"
_TLS = "check the TLS trust boto3 uses (AWS_CA_BUNDLE, ca_bundle in ~/.aws/config: a readable PEM file) and the " \
    "certificate the endpoint presents"
_ENDPOINT_URL = "fix the endpoint URL boto3 reads (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, endpoint_url in " \
    "~/.aws/config): http(s)://HOST[:PORT], the port 1..65535"
_CREDENTIALS = "check the credentials boto3 reads (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, " \
    "~/.aws/credentials)"
_REGION = "set the bucket's own region (AWS_REGION or AWS_DEFAULT_REGION, or region in ~/.aws/config)"
_BUCKET = "the bucket does not exist: create it, or fix the bucket name in the URL"
_DENIED = "this identity may not use the bucket (or the credentials are another's): check its IAM and bucket " \
    "policy (s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject)"
_BY_CODE = {
    "NoSuchBucket": _BUCKET, "404": _BUCKET, "NotFound": _BUCKET,
    "AccessDenied": _DENIED, "403": _DENIED, "Forbidden": _DENIED, "AllAccessDisabled": _DENIED,
    "PermanentRedirect": _REGION, "301": _REGION, "TemporaryRedirect": _REGION, "400": _REGION,
    "AuthorizationHeaderMalformed": _REGION, "IllegalLocationConstraintException": _REGION,
    "InvalidAccessKeyId": _CREDENTIALS, "SignatureDoesNotMatch": _CREDENTIALS, "ExpiredToken": _CREDENTIALS,
    "InvalidToken": _CREDENTIALS, "TokenRefreshRequired": _CREDENTIALS, "InvalidClientTokenId": _CREDENTIALS,
}
_BY_ERROR = {
    "EndpointConnectionError": _ENDPOINT, "ConnectTimeoutError": _ENDPOINT, "ReadTimeoutError": _ENDPOINT,
    "ConnectionClosedError": _ENDPOINT, "ProxyConnectionError": _ENDPOINT, "SSLError": _TLS,
    "EndpointResolutionError": _ENDPOINT_URL, "InvalidEndpointConfigurationError": _ENDPOINT_URL,
    "NoCredentialsError": _CREDENTIALS, "PartialCredentialsError": _CREDENTIALS,
    "CredentialRetrievalError": _CREDENTIALS, "ProfileNotFound": "AWS_PROFILE names a profile ~/.aws/config "
    "does not have: fix or unset it", "ConfigParseError": "fix the AWS config file boto3 reads (~/.aws/config)",
    "NoRegionError": _REGION, "InvalidRegionError": _REGION,
}
_WORDS = {_BUCKET: "no such bucket", _DENIED: "access denied", _REGION: "the region does not fit the bucket",
          _CREDENTIALS: "the credentials were refused", _ENDPOINT: "the endpoint does not answer",
          _TLS: "the TLS handshake failed", _ENDPOINT_URL: "the endpoint URL is not usable"}


def client_problem(what: str, code: str, message: str) -> OpsctlError:
    """An S3 error reply (its code, e.g. NoSuchBucket, 403, PermanentRedirect) as an error naming what failed, in
    words, with the hint for its cause; every URL in it masked."""
    hint = _BY_CODE.get(code, HINT)
    words = f" ({_WORDS[hint]})" if hint in _WORDS else ""
    return OpsctlError(mask_url(f"{what}: {code}{words} {message}".rstrip()), hint=hint)


def _code_in(exc: BaseException) -> tuple[str, str] | None:
    """The S3 error code and message a ClientError carries, also when boto3's transfer wrapped it
    (S3UploadFailedError, whose text embeds it)."""
    from botocore.exceptions import ClientError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ClientError):
            error = seen.response.get("Error", {})
            return str(error.get("Code", "?")), str(error.get("Message", ""))
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"An error occurred \(([^)]+)\) when calling the \w+ operation: (.*)", str(exc))
    return (found.group(1), found.group(2)) if found else None


@contextmanager
def _answered(what: str) -> Iterator[None]:
    """The one place boto3's errors become opsctl errors: an OpsctlError naming the object (URLs masked), its
    cause in words and a hint; boto3's texts name codes and endpoints, any secret in a URL masked."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, Boto3Error) as exc:
        code = _code_in(exc)
        if code is None:
            raise OpsctlError(mask_url(f"{what}: {type(exc).__name__}: {exc}"), hint=HINT) from None
        raise client_problem(what, *code) from None
    except BotoCoreError as exc:
        name = type(exc).__name__
        hint = _BY_ERROR.get(name, HINT)
        words = f" ({_WORDS[hint]})" if hint in _WORDS else ""
        raise OpsctlError(mask_url(f"{what}: {name}{words}: {exc}"), hint=hint) from None


def check_endpoint_url(variable: str, url: str) -> None:
    """An endpoint URL from the environment: http(s)://HOST[:PORT][/PATH], the host an address or a DNS name, the
    port 1..65535 written in digits (urllib takes `:+80` and botocore passes a port above 65535 on), no blanks, no
    query or fragment. Pure."""
    shown = f"{variable}={echo(mask_url(url))}"
    hint = f"set {variable} to http(s)://HOST[:PORT], e.g. https://s3.eu-west-1.amazonaws.com, or unset it"
    if any(c.isspace() for c in url):
        raise OpsctlError(f"{shown}: the URL holds blanks", hint=hint)
    scheme, sep, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not sep:
        raise OpsctlError(f"{shown}: not an http:// or https:// URL", hint=hint)
    after_user = rest[userinfo_end(rest, 0):]  # a raw password may hold `/`: no part of it is taken for the host
    if "?" in after_user or "#" in after_user:
        raise OpsctlError(f"{shown}: an endpoint has no query or fragment", hint=hint)
    hostport = after_user.partition("/")[0]
    if hostport.startswith("["):
        inside, close, tail = hostport.partition("]")
        host, colon, port = inside + close, tail[:1], tail[1:]
        if not close or tail[:1] not in ("", ":"):
            raise OpsctlError(f"{shown}: {echo(hostport)} is not [IPv6]:PORT", hint=hint)
    else:
        host, colon, port = hostport.partition(":")
    if not valid_host(host):
        raise OpsctlError(f"{shown}: {echo(host)} is not a host name or address", hint=hint)
    if colon and not valid_port(port):
        raise OpsctlError(f"{shown}: the port {echo(port)} is not a number from 1 to 65535", hint=hint)


MAX_ATTEMPTS = 10  # tries per request: boto3 backs off up to 20 s between tries; beyond, a store that is down
# keeps a run waiting for many minutes
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def _remember_password(url: str) -> None:
    """The password of an endpoint URL registered as a secret: no output line shows it, even cut out of the URL."""
    rest = url.partition("://")[2]
    remember(Secret(rest[:userinfo_end(rest, 0)][:-1].partition(":")[2]))


def _check_environment() -> None:
    """The AWS settings from the environment checked before boto3 reads them; its secrets registered so that no
    output line shows them."""
    for variable in SECRET_VARIABLES:
        remember(Secret(os.environ.get(variable, "")))
    for variable in ENDPOINT_VARIABLES:
        url = os.environ.get(variable)
        if url:
            check_endpoint_url(variable, url)
            _remember_password(url)
    attempts = os.environ.get("AWS_MAX_ATTEMPTS")
    if attempts is not None and ascii_decimal(attempts, 1, MAX_ATTEMPTS) is None:
        raise OpsctlError(f"AWS_MAX_ATTEMPTS={echo(attempts)} is not a number from 1 to {MAX_ATTEMPTS}",
                          hint="set it to the tries boto3 makes per request (its default is 3 or 5), or unset it")


def _check_attempts(attempts: object) -> None:
    """The tries per request boto3 resolved (AWS_MAX_ATTEMPTS or max_attempts in ~/.aws/config) in 1..MAX_ATTEMPTS:
    a store that is down must not keep a run retrying for hours."""
    if attempts is not None and not (isinstance(attempts, int) and 1 <= attempts <= MAX_ATTEMPTS):
        raise OpsctlError(f"max_attempts {echo(attempts)} (AWS_MAX_ATTEMPTS or ~/.aws/config) is not a number from 1 "
                          f"to {MAX_ATTEMPTS}", hint="set it to the tries boto3 makes per request (its default is 3 "
                                                     "or 5), or remove it")


class S3Store:
    """A bucket prefix. Objects are written whole (a PUT, or a multipart upload completed at once)."""

    def __init__(self, location: Location, transfer: TransferConfig | None = None) -> None:
        self.location, self.bucket, self.prefix = location, location.bucket, location.prefix
        try:
            import boto3
        except ImportError:
            raise OpsctlError("s3:// locations need boto3, which is not installed",
                              hint=f"pip install '{EXTRA}' (or pip install boto3), or use a folder") from None
        _check_environment()
        try:
            with _answered(f"cannot use {location.text}"):  # a missing profile, a bad region: said here
                self.s3 = boto3.session.Session().client("s3")  # typed by boto3-stubs (dev) as the S3 client
            endpoint = self.s3.meta.endpoint_url  # also from ~/.aws/config, which boto3 reads itself
            check_endpoint_url("endpoint_url (AWS_ENDPOINT_URL or ~/.aws/config)", endpoint)
            _remember_password(endpoint)
            retries: object = getattr(self.s3.meta.config, "retries", None)  # set by botocore, not in its stubs
            _check_attempts(retries.get("total_max_attempts") if isinstance(retries, dict) else None)
        except ValueError as exc:  # botocore reads its settings with int()/float(): a value it cannot read
            raise OpsctlError(f"cannot use {location.text}: boto3 cannot read its configuration ({exc})",
                              hint="check the AWS_* variables and ~/.aws/config") from None
        self.transfer = transfer or transfer_config()

    def probe(self, writing: bool) -> None:
        """The bucket answers (HeadBucket); writing, a marker object is written and deleted (denied writes, a
        read-only key: said before any shard is saved); reading, the prefix holds at least one object."""
        with _answered(f"cannot use {self.location.text}"):
            self.s3.head_bucket(Bucket=self.bucket)
            if writing:
                marker = f"{self.prefix}/{PROBE}" if self.prefix else PROBE
                self.s3.put_object(Bucket=self.bucket, Key=marker, Body=b"")
                self.s3.delete_object(Bucket=self.bucket, Key=marker)
                return
            base = f"{self.prefix}/" if self.prefix else ""
            found = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=base, MaxKeys=1)
        if not found.get("Contents"):
            raise OpsctlError(f"no backup at {self.location.text}: the bucket holds nothing under this prefix",
                              hint="give the location backups went to (`backup --to URL`): "
                                   "`opsctl backup list --from s3://BUCKET/PREFIX`")

    def key(self, name: str) -> str:
        check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    def where(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    def put_file(self, name: str, path: Path) -> None:
        with _answered(f"cannot upload {self.where(name)}"):
            self.s3.upload_file(str(path), self.bucket, self.key(name), Config=self.transfer)

    def put_bytes(self, name: str, data: bytes) -> None:
        with _answered(f"cannot upload {self.where(name)}"):
            self.s3.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def get_file(self, name: str, dest: Path) -> None:
        with _answered(f"cannot download {self.where(name)}"):
            self.s3.download_file(self.bucket, self.key(name), str(dest), Config=self.transfer)

    def get_bytes(self, name: str, limit: int = LIMIT) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            with _answered(f"cannot download {self.where(name)}"):
                reply = self.s3.get_object(Bucket=self.bucket, Key=self.key(name))
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
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                out += [item["Key"][len(base):] for item in page.get("Contents", []) if "Key" in item]
        return sorted(out)

    def delete(self, names: list[str]) -> None:
        for start in range(0, len(names), 1000):
            batch = [{"Key": self.key(n)} for n in names[start:start + 1000]]
            with _answered(f"cannot delete objects under s3://{self.bucket}/{self.prefix}"):
                reply = self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})  # type: ignore[typeddict-item]
            if reply.get("Errors"):
                first = reply["Errors"][0]
                raise OpsctlError(f"cannot delete s3://{self.bucket}/{first.get('Key')}: {first.get('Code')}",
                                  hint=HINT)
