"""One zero-CPU sampler actor per Ray node, and the driver's side that keeps them.

Each node the monitor scrapes (under :meth:`~GroupMemorySamplers.maintain`; each node with
a registered worker under :meth:`~GroupMemorySamplers.sample`) gets a
:class:`GroupMemorySamplerActor`, pinned there
with a hard node affinity and reserving no CPU or GPU, which reads the workers' process
trees with :class:`~raylens.telemetry.group_memory.GroupMemoryReader`: procfs can only be
read on the node, and asking the workers would wait behind their long methods.
:class:`GroupMemorySamplers` runs in the driver, called once per host-memory cycle:
:meth:`~GroupMemorySamplers.maintain` only keeps the samplers (they publish on their own
timer, see :mod:`raylens.distributed._group_memory_publishing`, and compute their node's
growth there); :meth:`~GroupMemorySamplers.sample` asks each for a reading under one deadline.

Invariants: a sampler that is slow, wedged or dead costs only its own node's result; it is
not asked again while its last request is open, and it is replaced once found dead, or after
``max_missed`` cycles without an answer once it has answered (before that, only when it gave
no first answer within ``start_timeout_s``). Under ``maintain`` the driver makes Ray calls
only where a node's workers changed, plus a liveness ping every ``ping_every`` cycles. Ray is
imported only when a manager first needs it, and any object with the few ``ray`` functions
used here can stand in for it.
"""

from __future__ import annotations

from raylens.distributed._group_memory_publishing import (
    DEFAULT_PSS_INTERVAL_SECONDS,
    DEFAULT_TREE_INTERVAL_SECONDS,
    GroupMemorySamplerActor,
)
from raylens.distributed._sampler_fleet import (
    DEFAULT_MAX_MISSED,
    DEFAULT_PING_EVERY,
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    STOP_GRACE_S,
)
from raylens.distributed._sampler_parts import (
    STUCK_INTERVALS,
    STUCK_MIN_S,
    SamplerError,
    collect_group_memory,
    worker_identity,
)
from raylens.distributed._sampler_postmortem import (
    LARGEST_PROCESSES_KEPT,
    LARGEST_PROCESSES_TIMEOUT_S,
    RECENT_HISTORY_PAUSE_S,
    RECENT_HISTORY_TIMEOUT_S,
    _SamplerPostMortem,
)
from raylens.distributed._sampler_reads import _SamplerReads
from raylens.distributed._sampler_upkeep import _SamplerUpkeep
from raylens.telemetry.growth import DEFAULT_SAMPLE_INTERVAL_S

__all__ = [
    "DEFAULT_MAX_MISSED",
    "DEFAULT_PING_EVERY",
    "DEFAULT_PSS_INTERVAL_SECONDS",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_TREE_INTERVAL_SECONDS",
    "LARGEST_PROCESSES_KEPT",
    "LARGEST_PROCESSES_TIMEOUT_S",
    "RECENT_HISTORY_PAUSE_S",
    "RECENT_HISTORY_TIMEOUT_S",
    "STOP_GRACE_S",
    "STUCK_INTERVALS",
    "STUCK_MIN_S",
    "GroupMemorySamplerActor",
    "GroupMemorySamplers",
    "SamplerError",
    "collect_group_memory",
    "worker_identity",
]


class GroupMemorySamplers(_SamplerUpkeep, _SamplerReads, _SamplerPostMortem):
    """The driver's side: keeps one sampler per node that hosts workers, and collects readings.

    ``ray`` is the ``ray`` module or a stand-in with ``remote``, ``wait``, ``get``,
    ``kill``, ``util.scheduling_strategies.NodeAffinitySchedulingStrategy`` and
    ``exceptions.RayActorError``; default the real one, imported on first use.
    ``timeout_s`` bounds how long :meth:`sample` waits for all readings together;
    under :meth:`maintain` samplers read every ``sample_interval_s`` and are pinged
    every ``ping_every`` cycles. A sampler that has answered is replaced after ``max_missed`` cycles in a row
    without an answer; one that has not answered yet, after ``start_timeout_s``
    seconds of ``clock`` (default :func:`time.monotonic`) since it was started,
    with one warning for the process.
    ``pss_interval_seconds``, ``tree_interval_seconds``, ``max_processes`` and
    ``procfs_root`` configure each sampler's reader (see :class:`GroupMemoryReader`).
    ``growth_window_s`` (default ``RAYLENS_GROWTH_WINDOW``, else 300 s; at least
    :func:`~raylens.telemetry.growth.shortest_growth_window` of ``sample_interval_s``) and
    ``kill_line`` (default: each sampler resolves it where it runs; see
    :meth:`configure_growth`) are each node's growth settings; ``started_by`` names this
    manager in every sampler's published identity (default :func:`monitor_identity`).
    Thread-safe: concurrent calls run one after the other.

    The code lives in private modules beside this one, each owning one path:
    :mod:`~raylens.distributed._sampler_fleet` (the samplers kept, starting, removing,
    misses, ids, closing), :mod:`~raylens.distributed._sampler_reads` (:meth:`sample`),
    :mod:`~raylens.distributed._sampler_upkeep` (:meth:`maintain` and its liveness
    rounds) and :mod:`~raylens.distributed._sampler_postmortem` (:meth:`largest_processes`,
    :meth:`recent_history`).
    """
