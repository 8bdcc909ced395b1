"""Workers lost to memory: noticing each kill once and leaving a post-mortem for it.

* :mod:`._kills` - :class:`Killer`, :class:`Victim`, :class:`EvictionWatch` (Ray's
  counter, first kill on a node included) and :class:`CounterWatch` (the kernel's), which
  turn a node's cumulative kill counters into kills.
* :mod:`._kernel_count` - :func:`read_kernel_oom_count`: the kernel's OOM-kill count
  a sampler reads (the container's ``memory.events``, else ``/proc/vmstat``).
* :mod:`._postmortem` - the post-mortem document and :class:`PostMortemWriter`
  (``RAYLENS_POSTMORTEM_DIR``, private, atomic, names that cannot collide, capped per
  process); :mod:`._bounds` keeps one document under :data:`MAX_POSTMORTEM_BYTES`.
* :mod:`._ledger` - :class:`OomLedger` (reports, the ``rl.host.oom_kills`` counts, recent
  kills) with its default instance behind :func:`report_worker_oom`.
* :mod:`._watch` - :class:`OomWatch`, the monitor cycle hook that joins the three
  sources.

Attach it to a monitor with :func:`attach_oom_watch`, after the growth cycle whose
history the post-mortems read.
"""

from __future__ import annotations

from typing import Any, Protocol

from raylens.telemetry.oom._bounds import MAX_GROUPS_SHOWN, MAX_POSTMORTEM_BYTES
from raylens.telemetry.oom._kernel_count import (
    CGROUP_ROOT,
    SOURCE_CGROUP,
    SOURCE_VMSTAT,
    KernelOomCount,
    read_kernel_oom_count,
)
from raylens.telemetry.oom._kills import (
    MAX_KILLS_PER_READING,
    CounterWatch,
    EvictionWatch,
    Killer,
    Victim,
    victim_from_ray_name,
)
from raylens.telemetry.oom._ledger import (
    DEFAULT_LEDGER,
    KILLER_ATTR,
    RECENT_KILLS,
    RL_HOST_OOM_KILLS_METRIC,
    KillRecord,
    OomLedger,
    register_oom_counter,
    report_worker_oom,
    reset_oom_state,
)
from raylens.telemetry.oom._postmortem import (
    DEFAULT_MAX_FILES,
    HISTORY_S,
    MAX_VICTIMS_LISTED,
    POSTMORTEM_DIR_ENV,
    SCHEMA,
    LargestProcess,
    PostMortemWriter,
    build_postmortem,
    default_postmortem_dir,
    reset_postmortem_budget,
)
from raylens.telemetry.oom._watch import (
    DEDUP_WINDOW_S,
    MAX_POSTMORTEMS_PER_CYCLE,
    PHASE_LOOKBACK_S,
    LargestProcesses,
    OomSource,
    OomWatch,
)

__all__ = [
    "CGROUP_ROOT",
    "DEDUP_WINDOW_S",
    "DEFAULT_LEDGER",
    "DEFAULT_MAX_FILES",
    "HISTORY_S",
    "KILLER_ATTR",
    "MAX_GROUPS_SHOWN",
    "MAX_KILLS_PER_READING",
    "MAX_POSTMORTEMS_PER_CYCLE",
    "MAX_POSTMORTEM_BYTES",
    "MAX_VICTIMS_LISTED",
    "PHASE_LOOKBACK_S",
    "POSTMORTEM_DIR_ENV",
    "RECENT_KILLS",
    "RL_HOST_OOM_KILLS_METRIC",
    "SCHEMA",
    "SOURCE_CGROUP",
    "SOURCE_VMSTAT",
    "CounterWatch",
    "EvictionWatch",
    "KernelOomCount",
    "KillRecord",
    "Killer",
    "LargestProcess",
    "LargestProcesses",
    "OomLedger",
    "OomSource",
    "OomWatch",
    "PostMortemWriter",
    "Victim",
    "attach_oom_watch",
    "build_postmortem",
    "default_postmortem_dir",
    "read_kernel_oom_count",
    "register_oom_counter",
    "report_worker_oom",
    "reset_oom_state",
    "reset_postmortem_budget",
    "victim_from_ray_name",
]


class _HookedMonitor(OomSource, Protocol):
    def add_cycle_hook(self, hook: Any, *, on_stop: Any = None) -> None: ...


def attach_oom_watch(monitor: _HookedMonitor, watch: OomWatch | None = None) -> OomWatch:
    """Declare ``rl.host.oom_kills`` and run ``watch`` (default: no files) after every cycle."""
    watch = watch if watch is not None else OomWatch()
    register_oom_counter(watch.ledger)
    monitor.add_cycle_hook(watch)
    return watch
