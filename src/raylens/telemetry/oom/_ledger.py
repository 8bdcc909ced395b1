"""Where kills meet their readers: reports waiting for a cycle, counts, and the recent kills.

:class:`OomLedger` holds the ``OutOfMemoryError`` reports not yet handled, the kill
counts behind ``rl.host.oom_kills`` and the latest kills ``watch`` shows, each bounded;
:data:`DEFAULT_LEDGER` is the process's, emptied by :func:`reset_oom_state`.
:class:`KillRecord` is what is kept of one kill event: what ``watch`` prints and the
file its post-mortem went to, never the document itself.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from raylens import forking
from raylens.lens import (
    OBSERVABLE_COUNTER,
    RecordedMetric,
    register_observable_counter,
    warn_once,
)
from raylens.telemetry.names import RAY_NODE_ID_ATTR
from raylens.telemetry.oom._kills import Killer, Victim

__all__ = [
    "DEFAULT_LEDGER",
    "KILLER_ATTR",
    "MAX_PENDING_REPORTS",
    "RECENT_KILLS",
    "RL_HOST_OOM_KILLS_METRIC",
    "KillRecord",
    "OomLedger",
    "Report",
    "phase_now",
    "register_oom_counter",
    "report_worker_oom",
    "reset_oom_state",
]

RL_HOST_OOM_KILLS_METRIC = "rl.host.oom_kills"
KILLER_ATTR = "killer"
#: Recent kills kept for ``watch``.
RECENT_KILLS = 20
#: Most OutOfMemoryError reports held between two cycles; more are dropped (logged once).
MAX_PENDING_REPORTS = 256
#: Most ``(node, killer)`` counts kept for the counter; kills past it are counted under node "other".
MAX_COUNTED_NODES = 4096
_OTHER_NODE = "other"
_LOGGER = logging.getLogger("raylens.oom")

_METRIC = RecordedMetric(
    RL_HOST_OOM_KILLS_METRIC,
    OBSERVABLE_COUNTER,
    "{kill}",
    "Workers lost to memory on the node, by killer (ray: Ray's memory monitor; kernel: the OOM killer)",
)


@dataclass(frozen=True)
class KillRecord:
    """One kill event as ``watch`` shows it, and the file its post-mortem went to."""

    node_id: str
    host: str
    killer: Killer
    wall_time: float
    victims: tuple[Victim, ...]
    path: Path | None
    seen_by: tuple[str, ...] = ()
    #: On the monitor's clock; for matching a late report.
    monotonic_at: float = 0.0
    kills: int = 1
    phase: str | None = None

    @property
    def victim(self) -> Victim:
        """The first victim (an unknown one when none is known)."""
        return self.victims[0] if self.victims else Victim()

    def as_plain(self) -> dict[str, Any]:
        """JSON-ready: what ``watch --json`` prints per kill event."""
        first = self.victim
        return {
            "node_id": self.node_id,
            "host": self.host,
            "killer": self.killer.value,
            "unix_time": round(self.wall_time, 3),
            "kills": self.kills,
            "phase": self.phase,
            "worker_group": first.group,
            "worker_rank": first.worker_rank,
            "pid": first.pid,
            "victims": [
                {
                    "group": v.group,
                    "worker_rank": v.worker_rank,
                    "pid": v.pid,
                    "ray_name": v.ray_name,
                }
                for v in self.victims
            ],
            "postmortem": None if self.path is None else str(self.path),
        }


@dataclass(frozen=True)
class Report:
    """A worker seen lost to Ray's out-of-memory error, and the phase it was seen in."""

    node_id: str | None
    victim: Victim
    wall_time: float
    phase: str | None = None


def phase_now(phase_of: Callable[[], object]) -> str | None:
    """The phase ``phase_of`` names now; None when it names none, or fails."""
    try:
        phase = phase_of()
    except Exception:  # noqa: BLE001 the caller's hook; goes on without a phase
        return None
    return phase if isinstance(phase, str) else None


class OomLedger:
    """Reports waiting for a cycle, kill counts per node and killer, and the recent kills."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: list[Report] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._recent: collections.deque[KillRecord] = collections.deque(maxlen=RECENT_KILLS)
        #: Names the job's phase when a report comes without one (the driver sets it).
        self.phase_of: Callable[[], str | None] | None = None
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock (a cycle may have held it at the fork)."""
        self._lock = threading.Lock()

    def report(
        self,
        *,
        node_id: str | None,
        group: str | None,
        worker_rank: int | None = None,
        pid: int | None = None,
        wall_time: float | None = None,
        phase: str | None = None,
    ) -> None:
        """A worker was lost to Ray's out-of-memory error. Never raises; bounded.

        ``phase`` defaults to what :attr:`phase_of` says now: a report is made where the
        call failed, usually still inside the phase that the kill ended.
        """
        if phase is None and self.phase_of is not None:
            phase = phase_now(self.phase_of)
        entry = Report(
            node_id if isinstance(node_id, str) and node_id else None,
            Victim(
                group if isinstance(group, str) else None,
                worker_rank if isinstance(worker_rank, int) else None,
                pid if isinstance(pid, int) else None,
            ),
            time.time() if wall_time is None else float(wall_time),
            phase if isinstance(phase, str) else None,
        )
        with self._lock:
            if len(self._reports) < MAX_PENDING_REPORTS:
                self._reports.append(entry)
                return
        warn_once(
            "oom.reports.full",
            f"more than {MAX_PENDING_REPORTS} out-of-memory reports between two monitor cycles; "
            "later ones are dropped (is the host-memory monitor running?)",
            logger=_LOGGER,
        )

    def take_reports(self) -> list[Report]:
        with self._lock:
            taken, self._reports = self._reports, []
            return taken

    def count(self, node_id: str, killer: Killer, kills: int = 1) -> None:
        with self._lock:
            key = (node_id, killer.value)
            if key not in self._counts and len(self._counts) >= MAX_COUNTED_NODES:
                key = (_OTHER_NODE, killer.value)
            self._counts[key] = self._counts.get(key, 0) + kills

    def counts(self) -> dict[tuple[str, str], int]:
        """``{(node id, killer): kills}`` since the process started (or the last reset)."""
        with self._lock:
            return dict(self._counts)

    def remember(self, record: KillRecord) -> None:
        with self._lock:
            self._recent.append(record)

    def replace(self, old: KillRecord, new: KillRecord) -> None:
        with self._lock:
            self._recent = collections.deque(
                (new if kept is old else kept for kept in self._recent), maxlen=RECENT_KILLS
            )

    def recent(self) -> list[KillRecord]:
        """The latest :data:`RECENT_KILLS` kills, oldest first."""
        with self._lock:
            return list(self._recent)

    def observe(self, _options: CallbackOptions | None = None) -> list[Observation]:
        return [
            Observation(kills, {RAY_NODE_ID_ATTR: node, KILLER_ATTR: killer})
            for (node, killer), kills in sorted(self.counts().items())
        ]

    def clear(self) -> None:
        with self._lock:
            self._reports.clear()
            self._counts.clear()
            self._recent.clear()


DEFAULT_LEDGER = OomLedger()


#: Tell raylens a worker was lost to Ray's out-of-memory error: :meth:`OomLedger.report`
#: of the default ledger.
report_worker_oom = DEFAULT_LEDGER.report


def reset_oom_state() -> None:
    """Forget every report, count and recent kill of the default ledger (tests)."""
    DEFAULT_LEDGER.clear()


def register_oom_counter(ledger: OomLedger | None = None) -> None:
    """Declare ``rl.host.oom_kills``, read from ``ledger`` (default :data:`DEFAULT_LEDGER`)."""
    register_observable_counter(_METRIC, (ledger or DEFAULT_LEDGER).observe)
