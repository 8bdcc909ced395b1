"""NodeGrowthKeeper: a node's history stays bounded as groups come and go, its phases kept."""

from __future__ import annotations

from raylens.telemetry.growth import GrowthSettings, KillLineConfig, NodeGrowthKeeper
from raylens.telemetry.growth._keeper import MAX_DEPARTED_GROUPS, NODE_KEY

GIB = float(1 << 30)


def test_groups_that_come_and_go_start_the_node_afresh_past_the_bound_phases_kept() -> None:
    keeper = NodeGrowthKeeper(GrowthSettings(), KillLineConfig(threshold=0.95))
    keeper.mark_phase(1.0)
    keeper.mark_phase(2.0)
    t = 10.0
    for index in range(MAX_DEPARTED_GROUPS + 2):
        keeper.record(t, 8 * GIB, {f"group-{index}": GIB}, host_total=64 * GIB)
        t += 1.0
    # Each reading names one new group, so every group before it has left the node.
    keys = keeper.history.keys()
    group_keys = [key for key in keys if isinstance(key, tuple) and key[1]]
    assert len(group_keys) <= MAX_DEPARTED_GROUPS + 1
    assert keeper.history.phase_boundaries(NODE_KEY) == (1.0, 2.0)
    keeper.mark_phase(t)
    assert keeper.history.phase_boundaries(NODE_KEY) == (1.0, 2.0, t)
