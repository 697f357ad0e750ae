"""A fleet: many topologies of one folder run at once through the library operations (opsctl.fleet.pool), one
summary of them (opsctl.fleet.summary), and staged rollouts in waves with a health gate and a journal
(opsctl.fleet.waves, opsctl.fleet.rolloutlog, opsctl.fleet.rollout)."""

from opsctl.fleet.rollout import RolloutOptions, RolloutResult, rollout
from opsctl.fleet.summary import FleetResult, Outcome, run_each

__all__ = ["FleetResult", "Outcome", "RolloutOptions", "RolloutResult", "rollout", "run_each"]
