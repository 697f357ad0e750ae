"""The redis_exporter's own ACL user (docs/monitoring.md, "The exporter's user"): its name, its least-privilege
rules and its password, derived from the admin password so that rotating that one rotates this one. Pure."""

from __future__ import annotations

import hashlib
import hmac

from opsctl.base.secrets import MASK, Secret
from opsctl.spec.load import LoadedSpec

EXPORTER_USER = "opsctl-exporter"
# What redis_exporter runs per scrape with -config-command - (CONFIG GET would hand it requirepass in clear text)
EXPORTER_RULES = ("-@all", "+info", "+client|setname", "+cluster|info", "+slowlog|get", "+slowlog|len",
                  "+latency|latest")
# What it runs on a Sentinel (found from ACL LOG on Redis 7.0 and Valkey 9.1 sentinels: docs/monitoring.md)
SENTINEL_EXPORTER_RULES = ("-@all", "+info", "+client|setname", "+sentinel|masters", "+sentinel|slaves",
                           "+sentinel|sentinels", "+sentinel|ckquorum")


RULE_FIELDS = ("flags", "commands", "keys", "channels")  # the ACL GETUSER fields that say what a user may do


PAYLOAD_FLAGS = frozenset({"sanitize-payload", "skip-sanitize-payload"})  # follow sanitize-dump-payload, not us


def acl_rule_words(*fields: str) -> tuple[str, ...]:
    """What a user may do as a sorted set of words (Redis 7.0 reorders the command rules it reports, Valkey keeps
    them as set): the exporter's rules only add commands after -@all, so their order carries no meaning."""
    return tuple(sorted({word for text in fields for word in text.split()} - PAYLOAD_FLAGS))


def exporter_rule_words(sentinel: bool) -> tuple[str, ...]:
    """The exporter user's rules as ACL GETUSER reports them live, in acl_rule_words' form: on, no key or channel."""
    return acl_rule_words("on", *(SENTINEL_EXPORTER_RULES if sentinel else EXPORTER_RULES))


def exporter_secret(topology: str, admin: Secret) -> Secret:
    """HMAC-SHA256(admin password, "<topology>\\0exporter"): never stored in the spec, the same on every run, and new
    whenever the admin password is."""
    mac = hmac.new(admin.reveal().encode(), f"{topology}\0exporter".encode(), hashlib.sha256)
    return Secret(mac.hexdigest())


def exporter_secrets(loaded: LoadedSpec) -> list[Secret]:
    """The passwords the exporter's user accepts: the current one, plus the one derived from auth.previous_password
    during a rotation's overlap (an exporter started before the rotation keeps logging in)."""
    credentials = loaded.credentials
    current = exporter_secret(loaded.spec.name, credentials.password)
    previous = credentials.previous
    if previous is None or not previous.reveal() or previous == credentials.password:
        return [current]
    return [current, exporter_secret(loaded.spec.name, previous)]


def exporter_acl_words(loaded: LoadedSpec, reveal: bool, sentinel: bool = False) -> list[str] | None:
    """The ACL words after the user's name (`on #<sha256>... -@all +info ...`, a Sentinel's rules for sentinel);
    None when no exporter runs."""
    if not loaded.spec.metrics.exporter:
        return None
    hashes = [f"#{hashlib.sha256(s.reveal().encode()).hexdigest() if reveal else MASK}"
              for s in exporter_secrets(loaded)]
    return ["on", *hashes, *(SENTINEL_EXPORTER_RULES if sentinel else EXPORTER_RULES)]
