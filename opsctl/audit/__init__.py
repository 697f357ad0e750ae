"""`opsctl audit`: the Redis development standard checked on live nodes, and safe big-key deletion.

Pure rules: findings, keynames, keyspace, nodechecks, report, resp. Thin I/O: pipe, discover, scan, probe,
run, bigdelete.
"""

from opsctl.audit.bigdelete import DeletePlan, DeleteResult, delete_big_key
from opsctl.audit.findings import RULES, Finding
from opsctl.audit.keyspace import Thresholds
from opsctl.audit.run import CHECKS, AuditOptions, AuditReport, run_audit

__all__ = ["CHECKS", "RULES", "AuditOptions", "AuditReport", "DeletePlan", "DeleteResult", "Finding", "Thresholds",
           "delete_big_key", "run_audit"]
