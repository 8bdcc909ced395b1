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
  sources, and :func:`attach_oom_watch`.

Attach it to a monitor with :func:`attach_oom_watch`, after the growth cycle whose
history the post-mortems read.
"""

from raylens.telemetry.oom._kernel_count import (
    SOURCE_CGROUP,
    SOURCE_VMSTAT,
    KernelOomCount,
    read_kernel_oom_count,
)
from raylens.telemetry.oom._kills import Killer, Victim
from raylens.telemetry.oom._ledger import (
    DEFAULT_LEDGER,
    RL_HOST_OOM_KILLS_METRIC,
    OomLedger,
    register_oom_counter,
    report_worker_oom,
    reset_oom_state,
)
from raylens.telemetry.oom._postmortem import (
    POSTMORTEM_DIR_ENV,
    LargestProcess,
    PostMortemWriter,
    build_postmortem,
)
from raylens.telemetry.oom._watch import OomWatch, attach_oom_watch

__all__ = [
    "DEFAULT_LEDGER",
    "POSTMORTEM_DIR_ENV",
    "RL_HOST_OOM_KILLS_METRIC",
    "SOURCE_CGROUP",
    "SOURCE_VMSTAT",
    "KernelOomCount",
    "Killer",
    "LargestProcess",
    "OomLedger",
    "OomWatch",
    "PostMortemWriter",
    "Victim",
    "attach_oom_watch",
    "build_postmortem",
    "read_kernel_oom_count",
    "register_oom_counter",
    "report_worker_oom",
    "reset_oom_state",
]
