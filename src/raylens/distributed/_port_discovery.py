"""Finding each bundle's address and a free port there: Ray stand-ins and batched fetching.

:mod:`raylens.distributed.virtual_cluster` exposes three module-level names NeMo-RL's
tests replace (``ray``, ``PlacementGroupSchedulingStrategy``,
``_get_node_ip_and_free_port``). Until replaced they hold the stand-ins defined here,
which reach the real thing only when used, so importing raylens never imports Ray.
"""

from __future__ import annotations

from typing import Any

from raylens.distributed import _ports
from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam

#: Rounds of asking again for bundles whose port repeats one already handed out.
PORT_ROUNDS = 10


class _RayStandIn:
    """Stands for the ``ray`` module until it is needed; the module is imported then."""

    def __getattr__(self, name: str) -> Any:
        import ray as ray_module

        return getattr(ray_module, name)

    def __repr__(self) -> str:
        return "<ray, imported on first use>"


class _StrategyStandIn:
    """Stands for Ray's ``PlacementGroupSchedulingStrategy`` class."""

    def __call__(self, **kwargs: Any) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(**kwargs)


def _port_finder_of(seam: RaySeam) -> Any:
    """The remote function that reports a node's IP and a free port in a range."""
    return seam.remote(
        "node_ip_and_free_port",
        lambda ray_module: ray_module.remote(num_cpus=0, num_gpus=0)(_ports._node_ip_and_free_port),
    )


class _PortFinderStandIn:
    """Stands for the remote function ``_get_node_ip_and_free_port`` (built on first use)."""

    def options(self, **options: Any) -> Any:
        return _port_finder_of(DEFAULT_RAY_SEAM).options(**options)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return _port_finder_of(DEFAULT_RAY_SEAM).remote(*args, **kwargs)


def _collect_in_batches(
    ray_api: Any, refs: list[Any], batch_size: int, timeout: dict[str, float]
) -> list[Any]:
    """The values of ``refs`` in their order, at most ``batch_size`` fetched at a time.

    ``ray.wait`` hands refs back as they finish, so each is put back in its place.
    A wait that returns nothing ready has run out of time (TimeoutError).
    """
    if len(refs) <= batch_size:
        return list(ray_api.get(refs, **timeout))
    position = {ref: i for i, ref in enumerate(refs)}
    values: list[Any] = [None] * len(refs)
    remaining = list(refs)
    while remaining:
        ready, remaining = ray_api.wait(
            remaining, num_returns=min(batch_size, len(remaining)), **timeout
        )
        if not ready:
            raise TimeoutError(f"{len(remaining)} result(s) not ready")
        for ref, value in zip(ready, ray_api.get(list(ready), **timeout)):
            values[position[ref]] = value
    return values


def _repeated_ports(results: list[tuple[str, int] | None], taken: set[int]) -> list[int]:
    """Positions whose port repeats an earlier one on its address, or is in ``taken``."""
    seen: set[tuple[str, int]] = set()
    repeated = []
    for i, result in enumerate(results):
        if result is None:
            continue
        if result in seen or result[1] in taken:
            repeated.append(i)
        seen.add(result)
    return repeated
