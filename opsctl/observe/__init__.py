"""What live nodes say, read purely: replies (parsers, the RESP value types, NodeObservation), cluster_state (is a
cluster converged), findings. Asking them is the I/O shell's (opsctl.net.observer).

Only the pure parts are re-exported here, so importing the package pulls in no network code.
"""

from opsctl.observe.cluster_state import Disagreement, cluster_problems, even_slot_ranges
from opsctl.observe.replies import (
    IMMUTABLE,
    PROTECTED,
    ClusterNodeLine,
    RoleInfo,
    config_equal,
    parse_cluster_nodes,
    parse_info,
    parse_role,
    to_bytes,
)

__all__ = ["IMMUTABLE", "PROTECTED", "ClusterNodeLine", "Disagreement", "RoleInfo", "cluster_problems",
           "config_equal", "even_slot_ranges", "parse_cluster_nodes", "parse_info", "parse_role", "to_bytes"]
