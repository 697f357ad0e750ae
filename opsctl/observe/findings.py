"""Findings and the rules they cite. Pure data: every finding names its rule, the source rule, the node and a fix.

Sources are cited by title and section, never by a file path: five published Chinese documents on running Redis
(SOURCES) and opsctl's own hardened baseline (README, "Hardened by default"; docs/audit.md), so a finding means the
same on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("info", "low", "medium", "high", "critical")


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


# The documents the rules come from, by title (the original title in brackets): a reader can find them anywhere.
BEST_PRACTICES = "Redis best practices (【最佳实践】 - Redis)"
INTERNALS = "Redis applications and internals (redis应用及原理)"
DEV_STANDARD = "Redis development standard (开发规范)"
KEY_NAMING = "Redis key naming standard (Redis-Key命名规范)"
BIG_KEYS = "Redis big-key solutions (Redis 大 key 解决方案)"
BASELINE = "opsctl hardened baseline"
SOURCES = (BEST_PRACTICES, INTERNALS, DEV_STANDARD, KEY_NAMING, BIG_KEYS, BASELINE)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    source: str


_RULES = (
    Rule("auth", "clients must authenticate",
         f"{INTERNALS}, section 命令及安全配置: 非默认端口,设置密码; {BEST_PRACTICES}, section 三(4) 设置合理的密码"),
    Rule("default-user", "the ACL default user is off",
         f"{BASELINE}: hardened configuration (ACL mode: user default off)"),
    Rule("dangerous-command", "KEYS/FLUSHALL/FLUSHDB are not callable, CONFIG/DEBUG renamed",
         f"{BEST_PRACTICES}, section 二(2) 【推荐】禁用命令: 禁止线上使用 keys、flushall、flushdb, "
         "通过 rename 机制禁掉"),
    Rule("protected-mode", "protected-mode yes",
         f"{INTERNALS}, section 命令及安全配置; {BASELINE}: hardened configuration"),
    Rule("bind", "bind the host's own LAN addresses only", f"{INTERNALS}, section 命令及安全配置: bind绑定局域网网卡"),
    Rule("persistence", "AOF everysec plus RDB snapshots",
         f"{INTERNALS}, section 持久化配置: 为了安全性使用AOF(1s刷盘), RDB定期备份"),
    Rule("maxmemory", "an explicit maxmemory and the spec's eviction policy",
         f"{BEST_PRACTICES}, section 三(5) 选好maxmemory-policy; {DEV_STANDARD}, section 如何选择: "
         "不设置最大内存会和磁盘频繁交换(swap)"),
    Rule("lazyfree", "lazyfree-lazy-* yes",
         f"{BIG_KEYS}, section 5 被动删除: lazyfree-lazy-expire/eviction/server-del; "
         f"{DEV_STANDARD}, section bigkey 的危害 3 过期删除"),
    Rule("protected-configs", "enable-protected-configs/debug/module-command no",
         f"{BASELINE}: hardened configuration (blocks CONFIG SET dir attacks, {INTERNALS}, section 命令及安全配置)"),
    Rule("config-drift", "the running node matches the spec",
         f"{BASELINE}: rendered, then verified on the running node"),
    Rule("bigkey-string", "strings stay under 10 KB",
         f"{BEST_PRACTICES}, section 一.2(1) 【强制】拒绝 bigkey: string 类型控制在 10KB 以内"),
    Rule("bigkey-collection", "collections stay under 5000 elements",
         f"{BEST_PRACTICES}, section 一.2(1) 【强制】拒绝 bigkey: hash、list、set、zset 元素个数不要超过 5000"),
    Rule("memory-skew", "shards hold similar amounts of memory",
         f"{BIG_KEYS}, section 3 redis 大 key 带来的影响: 内存空间不均匀"),
    Rule("hotkey", "no single key takes most of the traffic",
         f"{BEST_PRACTICES}, section 四(3) 热点key寻找; {DEV_STANDARD}, section LRU 算法 和 LFU 算法"),
    Rule("key-namespace", "business:table:id names",
         f"{BEST_PRACTICES}, section 一.1(1) 【强制】业务名为前缀, 用冒号分隔; {KEY_NAMING}, section 以冒号分开"),
    Rule("key-special-chars", "no spaces, newlines, quotes or escape characters",
         f"{BEST_PRACTICES}, section 一.1(3) 【强制】不要包含特殊字符"),
    Rule("key-case-style", "one case style per namespace",
         f"{KEY_NAMING}, section 建议风格一致: 做到项目级别的风格统一"),
    Rule("key-length", "short but readable names",
         f"{BEST_PRACTICES}, section 一.1(2) 【建议】简洁性; {KEY_NAMING}, section 长度约束"),
    Rule("ttl-missing", "keys carry a TTL",
         f"{BEST_PRACTICES}, section 一.2(3) 【推荐】控制key的生命周期, redis不是垃圾桶"),
    Rule("ttl-clustered", "expiries are spread out", f"{BEST_PRACTICES}, section 一.2(3) 打散过期时间, 防止集中过期"),
    Rule("slowlog", "no slow commands",
         f"{INTERNALS}, section 慢查询: 单线程任务, 慢查询会影响其他命令; {BEST_PRACTICES}, "
         "section 二(1) O(N)命令关注N的数量"),
    Rule("fragmentation", "memory fragmentation stays low", f"{INTERNALS}, section 内存配置: MEMORY STATS"),
    Rule("memory-headroom", "used memory stays below maxmemory",
         f"{DEV_STANDARD}, section 如何选择: maxmemory-policy and maxmemory"),
    Rule("clients", "connected clients stay below maxclients",
         f"{BEST_PRACTICES}, section 三(2) 使用带有连接池的数据库, 有效控制连接"),
    Rule("reachable", "every node of the spec answers", f"{BASELINE}: opsctl audit checks every running node"),
    Rule("scan-target", "big-key scans run on replicas", f"{BASELINE}: Big keys: detect on replicas, never with KEYS"),
    Rule("tls", "TLS only, TLS 1.2 or newer", f"{BEST_PRACTICES}, section 三(4) 如有必要可以使用SSL加密访问"),
    Rule("tls-expiry", "certificates are renewed before they expire", f"{BASELINE}: TLS (opsctl tls rotate)"),
)
UNREAD_RULE = "reachable"  # a node of the spec that the audit could not read: its report is incomplete
RULES: dict[str, Rule] = {rule.id: rule for rule in _RULES}


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    node: str
    message: str
    fix: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return RULES[self.rule].source

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "title": RULES[self.rule].title, "source": self.source}


def finding(rule: str, severity: str, node: str, message: str, fix: str, **data: Any) -> Finding:
    if rule not in RULES or severity not in SEVERITIES:
        raise ValueError(f"unknown rule {rule!r} or severity {severity!r}")
    return Finding(rule, severity, node, message, fix, dict(data))


def at_or_above(findings: Iterable[Finding], severity: str) -> list[Finding]:
    floor = severity_rank(severity)
    return [f for f in findings if severity_rank(f.severity) >= floor]


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first, then by rule and node, so reports are stable."""
    return sorted(findings, key=lambda f: (-severity_rank(f.severity), f.rule, f.node, f.message))
