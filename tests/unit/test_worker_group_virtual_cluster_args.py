"""RayVirtualCluster refuses numbers it could not honour, naming the argument and the value."""

from __future__ import annotations

import pytest

from raylens.distributed.virtual_cluster import RayVirtualCluster


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1, "30", None, True])
def test_placement_timeout_must_be_a_finite_positive_number(bad: object) -> None:
    # An infinite wait would overflow Ray's millisecond timeout after the groups were made.
    with pytest.raises(ValueError, match=rf"placement_timeout_s={bad!r}.*positive.*finite"):
        RayVirtualCluster([1], use_gpus=False, placement_timeout_s=bad)  # type: ignore[arg-type]


def test_placement_timeout_accepts_ints_and_floats() -> None:
    assert RayVirtualCluster([1], use_gpus=False, placement_timeout_s=5).placement_timeout_s == 5.0
    assert (
        RayVirtualCluster([1], use_gpus=False, placement_timeout_s=0.5).placement_timeout_s == 0.5
    )


def test_num_gpus_per_node_is_not_a_bool() -> None:
    with pytest.raises(ValueError, match=r"num_gpus_per_node=True"):
        RayVirtualCluster([1], use_gpus=True, num_gpus_per_node=True)  # type: ignore[arg-type]
