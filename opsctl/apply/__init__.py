"""The plan and apply operations: plan (opsctl.apply.planning) and apply, in rounds (opsctl.apply.rounds), on a
runtime (opsctl.runtime.opening), with their options and typed results."""

from opsctl.apply.planning import PlanOptions, PlanResult, plan
from opsctl.apply.rounds import ApplyOptions, ApplyResult, Approve, Round, apply, approve_all, run_plan

__all__ = ["ApplyOptions", "ApplyResult", "Approve", "PlanOptions", "PlanResult", "Round", "apply", "approve_all",
           "plan", "run_plan"]
