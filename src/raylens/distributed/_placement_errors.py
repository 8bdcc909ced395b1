"""Errors a virtual cluster raises when Ray cannot give it the bundles it asks for."""

from __future__ import annotations

__all__ = [
    "ClusterResourceError",
    "PlacementArgumentError",
    "PlacementGroupIndexError",
    "PlacementTimeoutError",
    "ResourceInsufficientError",
]


class ResourceInsufficientError(RuntimeError):
    """The cluster cannot hold what was asked for (too few CPUs or GPUs, or too few
    whole NVLink segments); placement is retried with backoff before this escapes."""


class ClusterResourceError(ResourceInsufficientError):
    """The Ray cluster does not have the CPUs or GPUs a virtual cluster asks for."""


class PlacementTimeoutError(TimeoutError):
    """Placement groups were not placed in time; the groups this cluster made are removed."""


class PlacementArgumentError(AssertionError, ValueError):
    """A virtual-cluster setting that NeMo-RL checks with an assertion is wrong.

    Both an AssertionError (what NeMo-RL raises) and a ValueError: a retry count from
    ``NRL_VIRTUAL_CLUSTER_MAX_RETRIES`` below 1, per-node constraints of the wrong
    length, or segments that leave bundles out.
    """


class PlacementGroupIndexError(IndexError, ValueError):
    """A placement-group index outside the cluster's groups (IndexError, as NeMo-RL's
    list lookup raises, and ValueError)."""
