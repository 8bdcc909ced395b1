"""raylens: where host memory goes on a Ray cluster.

Per node (scraped from every raylet), per worker group (the placement a
:class:`~raylens.distributed.worker_groups.RayWorkerGroup` reports) and per
managed process tree, exported through OpenTelemetry by :mod:`raylens.lens`.

``raylens.phase(name)`` marks a phase of the job in the driver and
``raylens.current_phase()`` names the one in progress (see
:mod:`raylens.distributed.phases`); both load on first use (``raylens._lazy``).

Importing raylens never imports Ray; the Ray-backed pieces import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raylens.distributed.phases import current_phase, phase

from raylens._lazy import __getattr__ as __getattr__
from raylens.version import __version__

__all__ = ["__version__", "current_phase", "phase"]
