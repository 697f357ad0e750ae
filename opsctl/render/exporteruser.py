"""opsctl's own ACL users beside the admin. The redis_exporter's (docs/monitoring.md, "The exporter's user"): its
name, its least-privilege rules and its password, derived from the admin password so that rotating that one rotates
this one. Pure.

A standby's write fence (docs/standby.md, "The fence"): while the spec says `follows:`, every client user lacks
`@write` (the default user in password mode, each `auth.users` user in ACL mode) and opsctl's follower user
(`opsctl-follower`) is the one that writes: `opsctl follow` logs in as it. A client's write, a script's or a
function's included (a script's redis.call is checked against its caller's rules), gets NOPERM, never a silent OK.
The fence is rendered into redis.conf (password mode) or users.acl (ACL mode), so a restart keeps it;
`opsctl switchover` lifts it at runtime with the words here. Pure.

The follower's password is derived from the admin password (as the exporter's is): never stored, the same on every
run, new whenever the admin password is. Only opsctl, which holds the admin password, can log in as it."""

from __future__ import annotations

import hashlib
import hmac

from opsctl.base.secrets import MASK, Secret
from opsctl.spec.aclrules import rule_tokens
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


FOLLOWER_USER = "opsctl-follower"
FENCE_RULE = "-@write"  # after every other rule of a fenced user: the last word wins
FOLLOWER_RULES = ("~*", "&*", "+@all")


def following(loaded: LoadedSpec) -> bool:
    """Whether the servers are rendered fenced: the spec declares a primary (a switched-over standby's apply is
    refused until `follows:` is removed, so this never re-fences a promoted site)."""
    return loaded.spec.follows is not None


def follower_secret(loaded: LoadedSpec) -> Secret:
    """HMAC-SHA256(admin password, "<topology>\\0follower")."""
    mac = hmac.new(loaded.credentials.password.reveal().encode(), f"{loaded.spec.name}\0follower".encode(),
                   hashlib.sha256)
    return Secret(mac.hexdigest())


def follower_words(loaded: LoadedSpec, reveal: bool) -> list[str]:
    """The follower user's ACL words after its name: on, its password's hash, every key and command."""
    secret = follower_secret(loaded).reveal() if reveal else ""
    shown = hashlib.sha256(secret.encode()).hexdigest() if reveal else MASK
    return ["on", f"#{shown}", *FOLLOWER_RULES]


def default_fence_line(hashes: str) -> str:
    """Password mode: the default user (every client's, and opsctl's admin) without @write; hashes: `#<sha> ...`."""
    return f"default on {hashes} ~* &* +@all {FENCE_RULE}"


def lifts(loaded: LoadedSpec) -> list[tuple[str, list[str]]]:
    """Each fenced user with the ACL SETUSER words that give it its rendered rules back without the fence: the
    default user (password mode) its @write; an ACL user its commands reset (-@all), then its rules and the
    disabled commands' denials again. Keys, channels and passwords stay as they are."""
    if loaded.spec.auth.mode == "password":
        return [("default", ["+@write"])]  # its rules are +@all, then the fence
    denied = [f"-{c.lower()}" for c in loaded.spec.hardening.disabled_commands]
    return [(u.name, ["-@all", *rule_tokens(u.rules), *denied]) for u in loaded.spec.auth.users]
