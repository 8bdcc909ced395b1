"""What a post-mortem asks a node's sampler after a kill: its largest processes and
its recent memory history.

Each question is one Ray call bounded by its timeout, made only when a kill is noticed,
and never raises; after a history ask that got nothing, later ones pause for
:data:`RECENT_HISTORY_PAUSE_S`.
"""

from __future__ import annotations

from raylens.distributed._sampler_fleet import _LOGGER, _SamplerFleet
from raylens.distributed._sampler_parts import _describe, ask_recent_history
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.growth import RecentHistory
from raylens.telemetry.oom import LargestProcess

__all__ = [
    "LARGEST_PROCESSES_KEPT",
    "LARGEST_PROCESSES_TIMEOUT_S",
    "RECENT_HISTORY_PAUSE_S",
    "RECENT_HISTORY_TIMEOUT_S",
]

RECENT_HISTORY_TIMEOUT_S = 2.0
"""How long a post-mortem waits for a node's sampler to give its recent history."""

RECENT_HISTORY_PAUSE_S = 30.0
"""After a sampler gave no history, how long later post-mortems go without asking."""

LARGEST_PROCESSES_TIMEOUT_S = 2.0
"""How long a post-mortem waits for a node's sampler to list its largest processes."""
#: Most processes taken from one sampler's answer.
LARGEST_PROCESSES_KEPT = 32


class _SamplerPostMortem(_SamplerFleet):
    """A node's largest processes and recent history, asked of its sampler after a kill."""

    def largest_processes(
        self, node_id: str, timeout_s: float = LARGEST_PROCESSES_TIMEOUT_S
    ) -> tuple[list[LargestProcess], float | None] | None:
        """A node's largest processes at its sampler's last reading before a kill, or None.

        One Ray call, made only when a kill is noticed, bounded by ``timeout_s``. None
        when the node has no sampler or it does not answer in time. Never raises.
        """
        with self._lock:
            sampler = self._samplers.get(node_id)
        if sampler is None:
            return None
        try:
            ray = self._ray_module()
            plain = ray.get(sampler.actor.largest_processes.remote(), timeout=timeout_s)
            if not isinstance(plain, dict):
                return None
            processes = [
                LargestProcess(int(pid), printable(str(group))[:200], int(rss))
                for pid, group, rss in list(plain.get("processes", ()))[:LARGEST_PROCESSES_KEPT]
            ]
            stamp = plain.get("sampled_at")
            return processes, float(stamp) if isinstance(stamp, (int, float)) else None
        except self._call_errors() as error:  # a wrong-shaped answer: TypeError, ValueError
            why = _describe(error)
        # Warned outside the except block: a sampler that died needs no traceback in the log.
        warn_once(
            "group_memory.sampler.largest_processes",
            f"could not ask node {printable(node_id[:80])}'s sampler for its largest "
            f"processes: {why} (warned once)",
            logger=_LOGGER,
        )
        return None

    def recent_history(
        self, node_id: str, at_wall: float, timeout_s: float = RECENT_HISTORY_TIMEOUT_S
    ) -> RecentHistory | None:
        """A node's recent memory up to the Unix time ``at_wall``, from its sampler's history.

        One Ray call, made only for a post-mortem, bounded by ``timeout_s``. None when the
        node has no sampler, it does not answer in time, or its answer is not a history.
        After an ask that got nothing, none waits again for :data:`RECENT_HISTORY_PAUSE_S`
        (a burst of kills on the monitor's thread costs one wait, not one each). Never raises.
        """
        with self._lock:
            sampler = self._samplers.get(node_id)
            paused = self._clock() < self._history_paused_until
        if sampler is None or paused:
            return None
        try:
            ray = self._ray_module()
        except ImportError:
            return None
        found = ask_recent_history(ray, sampler.actor, node_id, at_wall, timeout_s)
        if found is None:
            with self._lock:
                self._history_paused_until = self._clock() + RECENT_HISTORY_PAUSE_S
        return found
