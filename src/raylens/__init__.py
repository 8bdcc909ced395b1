"""raylens: where host memory goes on a Ray cluster.

Per node (scraped from every raylet), per worker group (the placement a
:class:`~raylens.distributed.worker_groups.RayWorkerGroup` reports) and per
managed process tree, exported through OpenTelemetry by :mod:`raylens.lens`.

``raylens.phase(name)`` marks a phase of the job in the driver and
``raylens.current_phase()`` names the one in progress (see
:mod:`raylens.distributed.phases`); both load on first use.

Importing raylens never imports Ray; the Ray-backed pieces import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raylens.distributed.phases import current_phase, phase

__version__ = "0.1.0"

__all__ = ["__version__", "current_phase", "phase"]

_LAZY = frozenset({"current_phase", "phase"})


def __getattr__(name: str) -> Any:
    # Looked up on the phases module at each call, so the functions stay bound to its
    # default marker as it is then.
    if name in _LAZY:
        from raylens.distributed import phases

        return getattr(phases, name)
    raise AttributeError(f"module 'raylens' has no attribute {name!r}")
