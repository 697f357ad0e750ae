"""Issue 33's adversarial classes on the backup, restore and migrate surfaces, pure (no server, no store but a
folder): S3 locations and schemes, URLs with secrets, the AWS endpoint settings, boto3's errors by code, ports,
options of another mode, destinations checked first, and every record read back range-checked by name."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import pytest

from opsctl.backup.lease import parse_lease
from opsctl.backup.manifest import MANIFEST, Manifest, ShardFile, manifest_json, parse_manifest
from opsctl.backup.offsite import upload_backup
from opsctl.backup.s3 import _answered, check_endpoint_url, client_problem
from opsctl.backup.segment import MAGIC, SegmentName, SegmentProblem, decode_segment, encode_segment
from opsctl.backup.store import FolderStore, parse_location
from opsctl.backup.timeline import RETENTION, dropped_before, group, parse_archive, parse_time
from opsctl.base.errors import OpsctlError
from opsctl.base.secrets import mask_url
from opsctl.migrate.foreign import parse_endpoints
from opsctl.migrate.phases import parse_journal
from opsctl.providers.remote.inventory import parse_bastion
from opsctl.providers.remote.publish import parse_write_to
from opsctl.spec.layout import split_endpoint
from opsctl.stream.framing import Entry
from tests.lifecycle import run
from tests.support import make_spec, write_spec

REPLID = "b" * 40
NOW = time.time()


# --- locations, URLs, the AWS settings ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["s4://bucket/x", "S3://bucket/x", "s3:/bucket/x", "s3:bucket", "file:/tmp/x",
                                  "file:///tmp/x", "https://bucket.s3.amazonaws.com/x", "gs://bucket/x", ""])
def test_a_location_with_an_unknown_scheme_is_refused_not_taken_as_a_folder(text: str) -> None:
    with pytest.raises(OpsctlError) as caught:
        parse_location(text)
    assert "s3://BUCKET/PREFIX" in caught.value.hint


def test_folders_and_s3_urls_still_parse() -> None:
    assert parse_location("./a:b").folder == Path("./a:b")
    assert parse_location("/srv/backups").folder == Path("/srv/backups")
    assert parse_location("s3://my-bucket/a/b/").prefix == "a/b"


@pytest.mark.parametrize("text", ["s3://user:TOPSECRET@bucket/x", "s3://bucket/x?X-Amz-Signature=TOPSECRET",
                                  "s4://user:TOPSECRET@bucket/x", "file://u:TOPSECRET@h/x"])
def test_a_secret_inside_a_location_is_never_echoed(text: str) -> None:
    with pytest.raises(OpsctlError) as caught:
        parse_location(text)
    assert "TOPSECRET" not in caught.value.render() and "***" in caught.value.render()


def test_mask_url_masks_user_info_and_query_strings() -> None:
    text = 'got "http://u:p@ss@h:9000/b/k?X-Amz-Signature=abc&X-Amz-Credential=def" and https://h/x'
    assert mask_url(text) == 'got "http://***@h:9000/b/k?***" and https://h/x'


@pytest.mark.parametrize(("url", "said"), [
    ("http://127.0.0.1:70000", "1 to 65535"), ("http://127.0.0.1:+80", "1 to 65535"),
    ("http://127.0.0.1:0", "1 to 65535"), ("ftp://h", "http"), ("h:9000", "http"),
    ("http://h :9000", "blanks"), (" http://h", "blanks"), ("http://", "host"), ("http://h:", "1 to 65535"),
    ("http://u:TOPSECRET@h:99999", "1 to 65535"), ("http://[::1", "IPv6"), ("http://[zz]:80", "host"),
    ("http://[::1]x", "IPv6"), ("http://h:80:90", "1 to 65535"), ("https://h/p?X-Amz-Signature=TOPSECRET", "query"),
])
def test_an_endpoint_url_is_checked_before_boto3_reads_it(url: str, said: str) -> None:
    with pytest.raises(OpsctlError) as caught:
        check_endpoint_url("AWS_ENDPOINT_URL", url)
    assert said in caught.value.summary and "TOPSECRET" not in caught.value.render()


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "https://s3.eu-west-1.amazonaws.com", "http://[::1]:9000",
                                 "https://minio.internal/", "http://u:p@h:1", "http://[::1]", "HTTPS://h/base"])
def test_good_endpoint_urls_pass(url: str) -> None:
    check_endpoint_url("AWS_ENDPOINT_URL", url)


@pytest.mark.parametrize(("code", "hint"), [
    ("NoSuchBucket", "does not exist"), ("404", "does not exist"), ("AccessDenied", "policy"), ("403", "policy"),
    ("PermanentRedirect", "region"), ("AuthorizationHeaderMalformed", "region"), ("301", "region"),
    ("InvalidAccessKeyId", "credentials"), ("SignatureDoesNotMatch", "credentials"), ("SlowDown", "endpoint"),
])
def test_s3_error_codes_become_errors_with_the_hint_of_their_cause(code: str, hint: str) -> None:
    error = client_problem("cannot upload s3://b/p/x", code, "see http://u:TOPSECRET@h/b?sig=TOPSECRET")
    assert error.summary.startswith("cannot upload s3://b/p/x: " + code) and hint in error.hint
    assert "TOPSECRET" not in error.render()


def test_boto3_transfer_and_connection_errors_are_answered_not_internal() -> None:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError, ParamValidationError

    cases = [
        (S3UploadFailedError("Failed to upload /x to b/k: An error occurred (NoSuchBucket) when calling the "
                             "PutObject operation: The specified bucket does not exist"), "no such bucket"),
        (EndpointConnectionError(endpoint_url="http://u:TOPSECRET@127.0.0.1:1/b"), "does not answer"),
        (NoCredentialsError(), "credentials"),
        (ParamValidationError(report="Invalid bucket name"), "ParamValidationError"),
    ]
    for raised, said in cases:
        with pytest.raises(OpsctlError) as caught, _answered("cannot use s3://b/p"):
            raise raised
        text = caught.value.render()
        assert said in text and "s3://b/p" in text and "TOPSECRET" not in text, text


def test_an_upload_that_fails_midway_removes_what_it_stored(tmp_path: Path) -> None:
    folder = tmp_path / "orders-20261201T000000Z"
    folder.mkdir()
    for name in ("shard-1.rdb", "shard-2.rdb", MANIFEST):
        (folder / name).write_bytes(b"x")
    manifest = _manifest()

    class Failing(FolderStore):
        def put_file(self, name: str, path: Path) -> None:
            if name.endswith(MANIFEST):
                raise OpsctlError("cannot upload the manifest")
            super().put_file(name, path)

    store = Failing(parse_location(str(tmp_path / "store")))
    with pytest.raises(OpsctlError, match="manifest"):
        upload_backup(store, folder, manifest)
    assert store.names() == []  # no shard left behind as if it were part of a backup


# --- ports and hosts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["h:70000", "h:0", "h:+80", "h: 80", "h:٣", "h:", ":80", "a b:1", "u:pw@h:1",
                                  "h/x:1", "h:1e3"])
def test_an_endpoint_outside_1_to_65535_or_malformed_is_refused(text: str) -> None:
    assert split_endpoint(text) is None
    with pytest.raises(OpsctlError) as caught:
        parse_endpoints(text)
    assert "pw" not in caught.value.summary


def test_good_endpoints_parse() -> None:
    assert parse_endpoints("10.0.0.1:6379,[::1]:7000, db-1.example.com:65535") == (
        ("10.0.0.1", 6379), ("::1", 7000), ("db-1.example.com", 65535))


@pytest.mark.parametrize("text", ["jump:70000", "ops@jump:x", "[::1]:99999", "ops@:22", "[::1]x"])
def test_a_bastion_or_write_to_host_with_a_bad_port_is_an_error_not_a_valueerror(text: str) -> None:
    with pytest.raises(OpsctlError):
        parse_bastion(text, "root")
    with pytest.raises(OpsctlError):
        parse_write_to(f"{text}:/etc/prometheus/targets.json")
    assert parse_bastion("ops@jump:2222", "root") == ("ops", "jump", 2222)


@pytest.mark.parametrize("text", ["prom:/etc/../x.json", "prom:/etc/p/\nx.json", "prom:/etc/./x.json"])
def test_a_write_to_path_with_odd_parts_is_refused(text: str) -> None:
    with pytest.raises(OpsctlError):
        parse_write_to(text)


# --- records read back -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("taken", ["NaN", "Infinity", "1e308", "-5", '"1000"', "true", "253402300799"])
def test_an_archive_description_with_an_impossible_time_is_refused_by_name(taken: str) -> None:
    text = f'{{"format": 1, "taken": {taken}, "shards": {{"1": {{"replid": "{REPLID}", "offset": 3}}}}}}'
    with pytest.raises(OpsctlError, match=r"a/archive.json: not an archive description"):
        parse_archive(text, "a/archive.json", NOW)


@pytest.mark.parametrize("shards", ['{"x": {}}', '{"-1": {}}', "{}",
                                    *(f'{{"1": {{"replid": "{REPLID}", "offset": {offset}}}}}'
                                      for offset in ("true", "1e30", "99999999999999999999", "-1"))])
def test_an_archive_description_with_impossible_shards_is_refused_by_name(shards: str) -> None:
    with pytest.raises(OpsctlError, match=r"a/archive.json"):
        parse_archive(f'{{"format": 1, "taken": 1000, "shards": {shards}}}', "a/archive.json", NOW)


def _entries() -> list[Entry]:
    return [Entry((b"SET", b"k", b"v"), 131, NOW - 10), Entry((b"DEL", b"k"), 150, NOW - 5)]


def _tampered(field: str, value: object) -> tuple[SegmentName, bytes]:
    _, data = encode_segment(1, REPLID, 100, _entries(), NOW, False)
    line_end = data.index(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC):line_end])
    header[field] = value
    data = MAGIC + json.dumps(header).encode() + data[line_end:]
    return SegmentName(100, 150, hashlib.sha256(data).hexdigest()), data


@pytest.mark.parametrize(("field", "value"), [("closed", math.nan), ("closed", 1e308), ("first", "soon"),
                                              ("last", -1.0), ("shard", True), ("start", 1 << 70),
                                              ("replid", 7), ("resumed", "no"), ("entries", 0)])
def test_a_segment_header_out_of_range_is_refused_by_name(field: str, value: object) -> None:
    name, data = _tampered(field, value)
    with pytest.raises(SegmentProblem, match=r"^w/seg"):
        decode_segment(name, data, "w/seg")


def test_a_segment_record_read_in_the_far_future_is_refused() -> None:
    far = [Entry((b"SET", b"k", b"v"), 131, NOW + 10 * 365 * 86400)]
    name, data = encode_segment(1, REPLID, 100, far, NOW, False)
    with pytest.raises(SegmentProblem, match=r"^w/seg"):
        decode_segment(name, data, "w/seg")


def test_a_lease_with_an_impossible_pid_or_time_holds_nothing_back() -> None:
    good = {"owner": "o", "host": "h", "pid": 12, "started": NOW - 5, "renewed": NOW - 1}
    assert parse_lease(json.dumps(good).encode()) is not None
    for field, value in (("pid", 1 << 40), ("pid", 0), ("renewed", math.inf), ("renewed", 1e300), ("started", -3)):
        assert parse_lease(json.dumps({**good, field: value}).encode()) is None, field
    assert parse_lease(b'{"owner": "o", "host": "h", "pid": 1, "started": NaN, "renewed": 1}') is None


@pytest.mark.parametrize("value", ["NaN", "1e308", '"yesterday"', "-1"])
def test_a_retention_record_with_an_impossible_time_is_refused_by_name(tmp_path: Path, value: str) -> None:
    store = FolderStore(parse_location(str(tmp_path)))
    store.put_bytes(f"{RETENTION}/orders.json", f'{{"dropped_before": {value}}}'.encode())
    with pytest.raises(OpsctlError, match=r"retention/orders.json"):
        dropped_before(store, "orders")


def test_base_names_with_an_impossible_date_are_not_bases() -> None:
    names = ["orders-20261399T000000Z/manifest.json", "orders-20261201T000000Z/manifest.json"]
    assert list(group(names)) == ["orders-20261201T000000Z"]


def _manifest() -> Manifest:
    shards = tuple(ShardFile(n, f"n{n}", "master", ((2 * n, 2 * n + 1),), f"shard-{n}.rdb", 1, str(n) * 64, {0: 1},
                             {0: 0}, {0: 1}, 0, "2026-12-01T00:00:00Z", 0) for n in (1, 2))
    return Manifest("orders", "cluster", "valkey", "9.1", 11, "2026-12-01T00:00:00Z", shards)


@pytest.mark.parametrize("when", ["9999-01-01T00:00:00Z", "1960-01-01T00:00:00Z", "2026-12-01T00:00:00"])
def test_a_manifest_saved_in_the_far_future_is_refused_by_name(when: str) -> None:
    data = json.loads(manifest_json(_manifest()))
    assert parse_manifest(json.dumps(data), "m.json").created_at == "2026-12-01T00:00:00Z"
    data["created_at"] = when
    with pytest.raises(OpsctlError, match=r"m.json: created_at is not an ISO time"):
        parse_manifest(json.dumps(data), "m.json")


@pytest.mark.parametrize("change", [{"source_ref": {"file": "/etc/other.yaml"}},
                                    {"shards": {"s1": {"phase": "bogus", "replid": REPLID, "offset": 1}}},
                                    {"shards": {"s1": {"phase": "stream", "replid": REPLID, "offset": -1}}}])
def test_a_migration_journal_with_foreign_fields_is_refused_by_name(change: dict[str, object]) -> None:
    journal = {"id": "ab", "source": "src", "finished": False, "shards": {}, "source_ref": {}, "fence": None,
               **change}
    with pytest.raises(OpsctlError, match=r"^j.json"):
        parse_journal(json.dumps(journal), "j.json")


@pytest.mark.parametrize(("text", "said"), [("9999-12-31T00:00:00Z", "in the future"),
                                            ("1960-01-01T00:00:00Z", "before 1970"),
                                            ("0001-01-01T00:00:00+01:00", "before 1970"), ("nan", "ISO 8601")])
def test_a_to_time_in_the_future_or_before_1970_is_refused(text: str, said: str) -> None:
    with pytest.raises(OpsctlError, match=said):
        parse_time(text, NOW)


# --- the command line: modes and destinations, before anything connects -----------------------------------------


def test_options_of_another_mode_are_refused_not_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """No server runs: each stops before opsctl reads a spec's servers, exit 1, no traceback."""
    monkeypatch.setenv("OPSCTL_SOURCE_PW", "source-pw")
    spec = str(write_spec(tmp_path, make_spec("standalone")))
    (tmp_path / "link").symlink_to(tmp_path)
    cases = [
        (["backup", "-f", spec, "--to", str(tmp_path / "b"), "--segment-seconds", "2"], "--continuous"),
        (["backup", "-f", spec, "--to", str(tmp_path / "b"), "--reconnect-timeout", "5", "--base-every", "1"],
         "go with --continuous"),
        (["backup", "-f", spec, "--to", str(tmp_path / "b"), "--keep-days", "3"], "`backup list|prune`"),
        (["backup", "list", "--from", str(tmp_path), "--keep-days", "3"], "goes with `backup prune`"),
        (["backup", "list", "--from", str(tmp_path), "--save-timeout", "9"], "not with `backup list`"),
        (["backup", "prune", "--from", str(tmp_path), "--keep-days", "1", "--continuous"], "not with `backup prune`"),
        (["backup", "verify", str(tmp_path), "--from", str(tmp_path)], "usage: opsctl backup verify --from"),
        (["backup", "list", str(tmp_path)], "reads its location from --from"),
        (["backup", "-f", spec, "--to", str(tmp_path / "link")], "symbolic link"),
        (["backup", "-f", spec, "--to", spec], "is not a folder"),
        (["backup", "-f", spec, "--to", str(tmp_path / "b"), "--metrics-textfile", str(tmp_path / "none")],
         "does not exist"),
        (["restore", "-f", spec, "--from", str(tmp_path), "--verify", "full", "--sample", "5"], "--verify sample"),
        (["restore", "-f", spec, "--from", str(tmp_path), "--dry-run", "--metrics-textfile", str(tmp_path / "link")],
         "symbolic link"),
        (["restore", "-f", spec, "--from", str(tmp_path / "none")], "no backup at"),
        (["restore", "-f", spec, "--from", str(tmp_path), "--to-time", "2999-01-01T00:00:00Z"], "in the future"),
        (["migrate", "-f", spec, "--from-endpoints", "127.0.0.1:70000", "--from-password-env", "X"], "1 to 65535"),
        (["migrate", "-f", spec, "--from-endpoints", "127.0.0.1:6379", "--from-password-env", "OPSCTL_NO_SUCH_VAR"],
         "not set"),
        (["migrate", "-f", spec, "--from-endpoints", "h:1", "--from-password-env", "OPSCTL_SOURCE_PW",
          "--from-tls-cert", spec],
         "go together"),
        (["migrate", "-f", spec, "--from", spec, "--lift-fence"], "`opsctl migrate cutover`"),
        (["migrate", "-f", spec, "--from", spec, "--lag-bound", "2"], "--cutover auto"),
        (["migrate", "cutover", "-f", spec, "--from-endpoints", "h:1"], "not with `migrate cutover`"),
        (["metrics", "targets", "-f", spec, "--write-to", "prom:70000:/etc/p/t.json"], "1 to 65535"),
    ]
    for argv, said in cases:
        code, _, err = run(capsys, *argv)
        assert code == 1 and said in err and "Traceback" not in err and "internal error" not in err, (argv, err)
    assert not (tmp_path / "b").exists()  # nothing was made for a refused run


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("AWS_ENDPOINT_URL", "http://127.0.0.1:70000", "AWS_ENDPOINT_URL="),
    ("AWS_ENDPOINT_URL_S3", "http://u:TOPSECRET@127.0.0.1:+9", "AWS_ENDPOINT_URL_S3="),
    ("AWS_MAX_ATTEMPTS", "abc", "AWS_MAX_ATTEMPTS="), ("AWS_MAX_ATTEMPTS", "100000000", "1 to 10"),
    ("AWS_METADATA_SERVICE_TIMEOUT", "x", "boto3 cannot read its configuration"),
])
def test_aws_settings_boto3_cannot_use_are_said_before_any_request(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                                     value: str, said: str) -> None:
    from opsctl.backup.s3 import S3Store

    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv(variable, value)
    with pytest.raises(OpsctlError) as caught:
        S3Store(parse_location("s3://bucket/p"))
    assert said in caught.value.render() and "TOPSECRET" not in caught.value.render()


@pytest.mark.parametrize(("field", "value"), [("restored", True), ("existing", 10 ** 40), ("volatile", -1),
                                              ("scanned", {"٣": 1}), ("scanned", {"0": 1e30})])
def test_a_restore_journal_with_impossible_counts_is_refused_by_name(field: str, value: object) -> None:
    from opsctl.restore.route import Counts, Journal, journal_json
    from opsctl.restore.route import parse_journal as parse_restore_journal

    text = journal_json(Journal("s3://b/p/x-20261201T000000Z", "replace", {"shard-1": Counts({0: 3}, 3)}))
    assert parse_restore_journal(text, "restore.json").done["shard-1"].restored == 3
    data = json.loads(text)
    data["done"]["shard-1"][field] = value
    with pytest.raises(OpsctlError, match=r"^restore\.json: a finished source's counts are malformed"):
        parse_restore_journal(json.dumps(data), "restore.json")


# --- review 3: a raw password with `/`, `+`, quotes or blanks is masked whole; boto3's resolved settings checked ----


PASSWORDS = ["se/cr", "p+q/r", 'p"w', "p'w", "p w", "a@b", "s#x?y"]  # `@` then `/`: a host and a path


@pytest.mark.parametrize("password", PASSWORDS)
def test_mask_url_masks_a_raw_password_whole(password: str) -> None:
    for text in (f"http://u:{password}@h:1/b?sig=x", f"error: 's3://AK:{password}@bucket/p': no", f"s3://k:{password}@b"):
        masked = mask_url(text)
        assert password not in masked and "u:" not in masked and "AK:" not in masked, masked
        assert "***@" in masked, masked
    assert mask_url(f"a http://h/x and https://u:{password}@h2/y") == "a http://h/x and https://***@h2/y"


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_location_holding_credentials_is_refused_without_echoing_any_part(capsys: pytest.CaptureFixture[str],
                                                                            tmp_path: Path, password: str) -> None:
    spec = str(write_spec(tmp_path, make_spec("standalone")))
    for argv in (["backup", "verify", "--from", f"s3://AKIAEXAMPLE:{password}@mybucket/p"],
                 ["backup", "-f", spec, "--to", f"s3://AKIAEXAMPLE:{password}@mybucket/p"]):
        code, out, err = run(capsys, *argv)
        assert code == 1 and "holds no user, key or password" in err and "Traceback" not in err, err
        assert "AKIAEXAMPLE" not in out + err and password not in out + err, err  # before: 'AKIAEXAMPLE:se' shown


@pytest.mark.parametrize("password", ["se/cr", "p+q/r", "p'w", 'p"w'])
def test_an_endpoint_url_with_a_raw_password_is_checked_and_never_echoed(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path, password: str) -> None:
    from opsctl.backup.s3 import S3Store

    check_endpoint_url("AWS_ENDPOINT_URL", f"http://u:{password}@127.0.0.1:9000")  # a good URL: accepted
    with pytest.raises(OpsctlError) as caught:
        check_endpoint_url("AWS_ENDPOINT_URL", f"http://u:{password}@127.0.0.1:99999")
    assert password not in caught.value.render() and f"{password[:2]!r}" not in caught.value.render()
    config = tmp_path / "config"  # the same URL, from the AWS config file boto3 reads itself
    config.write_text(f"[default]\nregion = us-east-1\nendpoint_url = http://u:{password}@127.0.0.1:99999\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    with pytest.raises(OpsctlError) as caught:
        S3Store(parse_location("s3://bucket/p"))
    assert password not in caught.value.render() and "u:" not in caught.value.render(), caught.value.render()


@pytest.mark.parametrize("attempts", ["100000", "50"])
def test_max_attempts_in_the_aws_config_file_is_range_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              attempts: str) -> None:
    from opsctl.backup.s3 import S3Store

    config = tmp_path / "config"
    config.write_text(f"[default]\nregion = us-east-1\nmax_attempts = {attempts}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    with pytest.raises(OpsctlError, match=r"max_attempts .* is not a number from 1 to 10"):
        S3Store(parse_location("s3://bucket/p"))


def test_a_stop_at_once_tells_only_a_journaling_command_to_resume() -> None:
    import signal

    from opsctl.base import stop

    for hint, said in ((stop.AGAIN_HINT, "journals nothing"), (stop.RESUME_HINT, "cluster fix")):
        with pytest.raises(stop.Stopped) as caught, stop.installed(hint):
            signal.raise_signal(signal.SIGTERM)
        assert said in caught.value.hint
    from opsctl.cli.main import JOURNALING

    assert "backup" not in JOURNALING and "status" not in JOURNALING and "apply" in JOURNALING


@pytest.mark.parametrize("key", ["²", "٣", " 3", "+3", "-1", "65536", "0x1"])
def test_a_manifest_with_a_database_key_that_is_no_ascii_number_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    """Review 3, finding 7: {"²": 0} crashed `backup verify` as "internal error: ValueError"; '٣' read as db 3."""
    data = json.loads(manifest_json(_manifest()))
    data["shards"][0]["keys"] = {key: 0}
    with pytest.raises(OpsctlError, match=r"m.json: .*keys.* is not a database number"):
        parse_manifest(json.dumps(data), "m.json")
    base = tmp_path / "orders-20261201T000000Z"
    base.mkdir()
    (base / MANIFEST).write_text(json.dumps(data))
    code, out, err = run(capsys, "backup", "verify", "--from", str(base))
    assert code == 1 and "is not a database number" in err and "internal error" not in err, err + out


def test_ascii_decimal_is_the_one_number_check() -> None:
    from opsctl.base.record import ascii_decimal
    from opsctl.spec.layout import valid_port

    assert [ascii_decimal(t, 1, 10) for t in ("3", "03", "10", "11", "0", "²", "٣", " 3", "+3", "", 3)] == \
        [3, 3, 10, None, None, None, None, None, None, None, None]
    assert valid_port("65535") and not valid_port("٦٥٥٣") and not valid_port("65536")


@pytest.mark.parametrize(("argv", "secret"), [
    (["metrics", "targets", "-f", "SPEC", "--write-to", "user:hunter2@prom:/etc/x.json"], "hunter2"),
    (["metrics", "targets", "-f", "SPEC", "--write-to", "ssh://u:hunter2@prom/etc/x.json"], "hunter2"),
    (["metrics", "targets", "-f", "SPEC", "--write-to", "u:hun/ter2@prom:/etc/x.json"], "hun"),
    (["migrate", "-f", "SPEC", "--from-endpoints", "u:pa,ss@10.0.0.1:6379", "--from-password-env", "X"], "u:pa"),
    (["migrate", "-f", "SPEC", "--from-endpoints", "10.0.0.1:6379,u:hunter2@10.0.0.2:6379", "--from-password-env",
      "X"], "hunter2"),
])
def test_a_login_typed_into_a_host_option_is_refused_and_never_echoed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], secret: str) -> None:
    """Review 3, findings 10 and 15: `--write-to user:hunter2@prom:/x` said `cannot connect to host user:hunter2@prom`,
    an ssh:// URL was parsed as host `ssh`, and `--from-endpoints 'u:pa,ss@h:1'` echoed 'u:pa'."""
    spec = str(write_spec(tmp_path, make_spec("cluster")))
    code, out, err = run(capsys, *(spec if word == "SPEC" else word for word in argv))
    assert code == 1 and "***@" in err and "Traceback" not in err, err
    assert secret not in out + err and "u:" not in err and "user:" not in err, err


@pytest.mark.parametrize("text", ["s3//mybucket/pre", "S3/mybucket", "s3\\mybucket", " s3://mybucket/p",
                                  "s3://mybucket/p ", " /srv/backups", "s3:mybucket"])
def test_a_mistyped_scheme_or_a_blank_is_refused_not_made_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """Review 3, finding 11: `--from 's3//mybucket/pre'` said `s3/mybucket/pre is not a directory`; `--to` made it."""
    monkeypatch.chdir(tmp_path)
    spec = str(write_spec(tmp_path, make_spec("standalone")))
    for argv in (["backup", "verify", "--from", text], ["backup", "-f", spec, "--to", text]):
        code, _out, err = run(capsys, *argv)
        assert code == 1 and "s3://BUCKET/PREFIX" in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "s3").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["topology.yaml"]
    assert parse_location("./s3/x").folder == Path("./s3/x")


def test_tls_and_endpoint_url_errors_name_their_cause() -> None:
    """Review 3, finding 19: AWS_CA_BUNDLE=/nonexist was reported as `SSLError (the endpoint does not answer)`, a port
    99999 in ~/.aws/config as `EndpointResolutionError (the endpoint does not answer)`."""
    from botocore.exceptions import EndpointResolutionError, SSLError

    cases = [(SSLError(endpoint_url="https://h:1", error="CERTIFICATE_VERIFY_FAILED"), "TLS handshake failed",
              "AWS_CA_BUNDLE"),
             (EndpointResolutionError(msg="port 99999"), "endpoint URL is not usable", "1..65535")]
    for raised, words, hint in cases:
        with pytest.raises(OpsctlError) as caught, _answered("cannot use s3://b/p"):
            raise raised
        assert words in caught.value.summary and hint in caught.value.hint, caught.value.render()
        assert "does not answer" not in caught.value.render()


def test_a_backup_folder_named_through_a_link_is_read_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 3, finding 12: `backup list --from LINK` was refused while `backup verify --from LINK` read through it.
    One rule: a folder the command line names is read through a link (followed once), never written through one."""
    folder = tmp_path / "backups" / "orders-20261201T000000Z"
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(manifest_json(_manifest()))
    (tmp_path / "link").symlink_to(tmp_path / "backups")
    listed = [run(capsys, "backup", "list", "--from", str(where), "-o", "json") for where in
              (tmp_path / "backups", tmp_path / "link")]
    assert [code for code, _, _ in listed] == [0, 0], listed
    assert json.loads(listed[0][1])["bases"] == json.loads(listed[1][1])["bases"] != []
