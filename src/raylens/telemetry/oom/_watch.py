"""Noticing workers lost to memory, once each, and leaving a post-mortem for every kill event.

:class:`OomWatch` is the monitor cycle hook that joins the three sources of a kill: Ray's
eviction counter (read at every scrape, whoever fetches the job's results), a group
call's ``OutOfMemoryError`` and the kernel's count. Invariants a maintainer must keep:

- one kill is counted once, whichever sources saw it and in whatever order
  (:data:`DEDUP_WINDOW_S`); the kills one scrape of a node reveals (one eviction round)
  are one event, and one post-mortem lists its victims;
- at most :data:`MAX_POSTMORTEMS_PER_CYCLE` post-mortems are built per cycle: the rest
  are counted and named in one warning line;
- the only Ray call is the ask for a node's largest processes, made only for a kill
  (:data:`MAX_ASKS_PER_CYCLE`), and never to a sampler the kill took;
- what is kept between cycles is small (a few numbers per node, each recent event's
  victims and file name), and nothing here raises into the monitor.

The phase of a kill is the phase in progress when it is noticed, else the last one seen
within :data:`PHASE_LOOKBACK_S` (a job whose call failed has usually left its phase by
the time the counter reaches the endpoint), and a reported error's own phase wins.
The sources, what each kill gets and why: ``docs/architecture.md``, *OOM post-mortems*,
and the README's *OOM kills*.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from raylens import forking
from raylens.safe_text import printable
from raylens.telemetry.growth import KillLineConfig, RecentHistory
from raylens.telemetry.host_memory import NodeSample
from raylens.telemetry.oom._kills import (
    CounterWatch,
    EvictionWatch,
    Killer,
    Victim,
    victim_from_ray_name,
)
from raylens.telemetry.oom._ledger import (
    DEFAULT_LEDGER,
    KillRecord,
    OomLedger,
    Report,
    phase_now,
    register_oom_counter,
)
from raylens.telemetry.oom._postmortem import (
    MAX_VICTIMS_LISTED,
    LargestProcess,
    PostMortemWriter,
    build_postmortem,
    victim_fields,
)
from raylens.telemetry.raylet_payload import NodeOomCounts

__all__ = [
    "DEDUP_WINDOW_S",
    "MAX_ASKS_PER_CYCLE",
    "MAX_POSTMORTEMS_PER_CYCLE",
    "PHASE_LOOKBACK_S",
    "LargestProcesses",
    "OomSource",
    "OomWatch",
    "attach_oom_watch",
]

#: A counted Ray kill and a reported OutOfMemoryError on one node this close are one kill.
DEDUP_WINDOW_S = 60.0
#: Most kill events per cycle whose node's sampler is asked for its largest processes (each
#: ask may wait up to its timeout on the monitor's thread); later ones go without the list.
MAX_ASKS_PER_CYCLE = 4
#: Most post-mortems built in one cycle; later kill events are counted and logged.
MAX_POSTMORTEMS_PER_CYCLE = 8
#: How long a phase that ended is still the phase of a kill noticed after it.
PHASE_LOOKBACK_S = 30.0
#: Recent Ray kill events kept for a late report to name their victims.
_MAX_AWAITING = 64
_LOGGER = logging.getLogger("raylens.oom")

#: ``node id -> (largest processes, Unix time of the reading)`` or None when unknown.
LargestProcesses = Callable[[str], "tuple[Sequence[LargestProcess], float | None] | None"]


class OomSource(Protocol):
    """What an :class:`OomWatch` reads of a monitor: its samples and the kill counters."""

    def latest(self) -> list[NodeSample]: ...

    def oom_counts(self) -> dict[str, tuple[str, NodeOomCounts, float]]: ...


class GrowthHistory(Protocol):
    """Where a node's recent memory and the kill line come from (a growth cycle)."""

    @property
    def kill_line(self) -> KillLineConfig: ...

    def recent_history(self, node_id: str, at: float) -> RecentHistory | None:
        """The node's memory up to ``at`` (the monitor's clock), None when none is kept."""
        ...


@dataclass
class _Kill:
    """One kill event being put together in a cycle."""

    node_id: str
    host: str
    killer: Killer
    monotonic_at: float
    victims: list[Victim] = field(default_factory=list)
    kills: int = 1
    sources: list[str] = field(default_factory=list)
    phase: str | None = None


@dataclass(frozen=True)
class _Reported:
    """A kill recorded from a report, waiting for the counter to show it."""

    node_id: str
    wall_time: float
    group: str | None


def _no_phase() -> str | None:
    return None


def _same_worker(known: Victim, report: Victim) -> bool:
    if known.pid is not None or known.group is None or known.group != report.group:
        return False
    return known.worker_rank is None or known.worker_rank == report.worker_rank


def _merged(known: Victim, report: Victim) -> Victim:
    return Victim(
        known.group,
        report.worker_rank if report.worker_rank is not None else known.worker_rank,
        report.pid,
        known.ray_name,
    )


class OomWatch:
    """A monitor cycle hook: find the cycle's kills, join their sources, record each once.

    ``growth`` supplies the history and kill line (a
    :class:`~raylens.telemetry.growth_outlook.GrowthCycle` attached to the same monitor, before
    this hook); without it a post-mortem has no history. ``writer`` None writes no
    files (a ``watch`` that only shows kills). ``phase_of`` names the job's phase now
    (default: none); it is asked once per cycle, so it must be cheap. ``largest_processes_of``
    asks a node's sampler for its largest processes (the driver wires it; default: none).
    ``wall_clock`` stamps kills (default :func:`time.time`). Never raises into the
    monitor: a failure is logged once per kind by the monitor and the next cycle carries on.
    """

    def __init__(
        self,
        *,
        growth: GrowthHistory | None = None,
        writer: PostMortemWriter | None = None,
        phase_of: Callable[[], str | None] = _no_phase,
        largest_processes_of: LargestProcesses | None = None,
        ledger: OomLedger | None = None,
        wall_clock: Callable[[], float] = time.time,
        dedup_window_s: float = DEDUP_WINDOW_S,
    ) -> None:
        self.growth = growth
        self.writer = writer
        self.phase_of = phase_of
        self.largest_processes_of = largest_processes_of
        self.ledger = ledger if ledger is not None else DEFAULT_LEDGER
        self.wall_clock = wall_clock
        self.dedup_window_s = float(dedup_window_s)
        self._ray = EvictionWatch()
        self._kernel = CounterWatch()
        #: Per host: the highest kernel count already turned into kills.
        self._host_kernel: dict[str, float] = {}
        #: Kills recorded from a report, waiting for the counter to show them.
        self._awaiting_counter: list[_Reported] = []
        #: Recent Ray kill events, for a report naming one of their victims.
        self._awaiting_victim: list[KillRecord] = []
        self._phase: str | None = None
        self._last_phase: tuple[str, float] | None = None
        self._asks_left = MAX_ASKS_PER_CYCLE
        self._lock = threading.Lock()
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock."""
        self._lock = threading.Lock()

    def __call__(self, monitor: OomSource) -> None:
        with self._lock:
            self._asks_left = MAX_ASKS_PER_CYCLE
            samples = {sample.node_id: sample for sample in monitor.latest()}
            now = self.wall_clock()
            self._note_phase(now)
            self._expire(now)
            events = self._counted(monitor.oom_counts(), samples)
            events += self._joined(events, self.ledger.take_reports(), samples, now)
            built = events[:MAX_POSTMORTEMS_PER_CYCLE]
            for kill in built:
                self._record(kill, samples, now)
            if len(events) > len(built):
                self._count_unbuilt(events[len(built) :], now)

    # phases -----------------------------------------------------------------------

    def _note_phase(self, now: float) -> None:
        self._phase = phase_now(self.phase_of)
        if self._phase is not None:
            self._last_phase = (self._phase, now)

    def _kill_phase(self, now: float) -> str | None:
        if self._phase is not None:
            return self._phase
        if self._last_phase is not None and now - self._last_phase[1] <= PHASE_LOOKBACK_S:
            return self._last_phase[0]
        return None

    # finding kills ----------------------------------------------------------------

    def _counted(
        self, counts: dict[str, tuple[str, NodeOomCounts, float]], samples: dict[str, NodeSample]
    ) -> list[_Kill]:
        events: list[_Kill] = []
        answered = {
            node for node, s in samples.items() if s.error is None and s.sampled_at is not None
        }
        for node_id in sorted(answered | set(counts)):
            entry = counts.get(node_id)
            if entry is None:
                self._ray.kills(node_id, None)  # scraped, no counter: no kill yet
                continue
            host, found, read_at = entry
            added, names = self._ray.kills(node_id, found.ray_evictions, found.ray_victims)
            if added:
                added, names = self._not_yet_recorded(node_id, added, names)
            if added:
                events.append(
                    _Kill(
                        node_id,
                        host,
                        Killer.RAY,
                        read_at,
                        victims=[victim_from_ray_name(name) for name in names],
                        kills=added,
                        sources=["ray_counter"],
                    )
                )
            fresh = self._kernel_kills(node_id, host, found)
            if fresh:
                events.append(
                    _Kill(
                        node_id, host, Killer.KERNEL, read_at, kills=fresh, sources=["kernel_count"]
                    )
                )
        live = set(samples) | set(counts)
        self._ray.keep_only(live)
        self._kernel.keep_only(live)
        hosts = {sample.host for sample in samples.values()} | {c[0] for c in counts.values()}
        self._host_kernel = {h: v for h, v in self._host_kernel.items() if h in hosts}
        return events

    def _kernel_kills(self, node_id: str, host: str, found: NodeOomCounts) -> int:
        added = self._kernel.kills(node_id, found.kernel_oom_kills)
        if not added or found.kernel_oom_kills is None:
            return 0
        value = found.kernel_oom_kills
        # Nodes on one machine read one count: only what no node reported yet is new.
        done = self._host_kernel.get(host, value - added)
        self._host_kernel[host] = max(done, value)
        return max(0, min(added, int(value - done + 0.5)))

    def _not_yet_recorded(
        self, node_id: str, added: int, names: list[str]
    ) -> tuple[int, list[str]]:
        """Take out the kills of this increase that a report already recorded."""
        names = list(names)
        for reported in [r for r in self._awaiting_counter if r.node_id == node_id]:
            if added == 0:
                break
            self._awaiting_counter.remove(reported)
            added -= 1
            for index, name in enumerate(names):
                if victim_from_ray_name(name).group == reported.group:
                    del names[index]
                    break
        return added, names[:added]

    def _joined(
        self, events: list[_Kill], reports: list[Report], samples: dict[str, NodeSample], now: float
    ) -> list[_Kill]:
        """Give each report to its node's event, an earlier event, or a new event of its own."""
        by_node = {kill.node_id: kill for kill in events if kill.killer is Killer.RAY}
        left: dict[str, list[Report]] = {}
        for report in reports:
            kill = by_node.get(report.node_id or "")
            if kill is not None:
                self._merge(kill, report)
            elif report.node_id is None or not self._named_later(report):
                left.setdefault(report.node_id or "unknown", []).append(report)
        new: list[_Kill] = []
        for node_id, found in left.items():
            sample = samples.get(node_id)
            new.append(
                _Kill(
                    node_id,
                    sample.host if sample is not None else "unknown",
                    Killer.RAY,
                    _sample_time(sample),
                    victims=[report.victim for report in found],
                    kills=len(found),
                    sources=["out_of_memory_error"],
                    phase=next((r.phase for r in found if r.phase is not None), None),
                )
            )
            if node_id != "unknown":
                self._awaiting_counter.extend(
                    _Reported(node_id, now, report.victim.group) for report in found
                )
        return new

    def _merge(self, kill: _Kill, report: Report) -> None:
        for index, known in enumerate(kill.victims):
            if _same_worker(known, report.victim):
                kill.victims[index] = _merged(known, report.victim)
                break
        else:
            if len(kill.victims) < kill.kills:
                kill.victims.append(report.victim)
        if "out_of_memory_error" not in kill.sources:
            kill.sources.append("out_of_memory_error")
        if report.phase is not None:
            kill.phase = report.phase

    def _named_later(self, report: Report) -> bool:
        """A report naming a victim of a Ray kill already recorded: say so in its file."""
        for record in reversed(self._awaiting_victim):
            if record.node_id != report.node_id:
                continue
            for index, known in enumerate(record.victims):
                if _same_worker(known, report.victim):
                    victims = list(record.victims)
                    victims[index] = _merged(known, report.victim)
                    self._rewrite(record, tuple(victims), report.phase)
                    return True
        return False

    def _rewrite(self, record: KillRecord, victims: tuple[Victim, ...], phase: str | None) -> None:
        listed = [victim_fields(v) for v in victims[:MAX_VICTIMS_LISTED]]
        new_phase = record.phase if record.phase is not None else phase

        def change(document: dict[str, Any]) -> None:
            document["victims"] = listed
            document["victim"] = listed[0]
            document["seen_by"] = sorted({*document.get("seen_by", ()), "out_of_memory_error"})
            if document.get("phase") is None and new_phase is not None:
                document["phase"] = printable(new_phase[:200])

        path = record.path
        if path is not None and self.writer is not None:
            path = self.writer.amend(path, change)
        seen = tuple(sorted({*record.seen_by, "out_of_memory_error"}))
        updated = replace(record, victims=victims, path=path, seen_by=seen, phase=new_phase)
        self.ledger.replace(record, updated)
        self._awaiting_victim = [updated if r is record else r for r in self._awaiting_victim]
        _LOGGER.info(
            "raylens: the worker killed for memory on node %s was of %s; post-mortem updated: %s",
            printable(record.node_id[:64]),
            _group_words(victims[0]),
            "not written" if path is None else printable(str(path)),
        )

    def _expire(self, now: float) -> None:
        window = self.dedup_window_s
        self._awaiting_counter = [r for r in self._awaiting_counter if now - r.wall_time <= window]
        self._awaiting_victim = [r for r in self._awaiting_victim if now - r.wall_time <= window]

    # recording --------------------------------------------------------------------

    def _record(self, kill: _Kill, samples: dict[str, NodeSample], now: float) -> None:
        phase = kill.phase if kill.phase is not None else self._kill_phase(now)
        sampler_killed = any(victim.is_sampler for victim in kill.victims)
        document = self._document(kill, samples.get(kill.node_id), now, phase, sampler_killed)
        path = self.writer.write(document) if self.writer is not None else None
        del document  # the file holds it; the record keeps what watch shows
        record = KillRecord(
            kill.node_id,
            kill.host,
            kill.killer,
            now,
            tuple(kill.victims[:MAX_VICTIMS_LISTED]),
            path,
            tuple(sorted(kill.sources)),
            kill.monotonic_at,
            kill.kills,
            phase,
        )
        self.ledger.count(kill.node_id, kill.killer, kill.kills)
        self.ledger.remember(record)
        if kill.killer is Killer.RAY and "ray_counter" in kill.sources:
            self._awaiting_victim = [*self._awaiting_victim, record][-_MAX_AWAITING:]
        _LOGGER.warning(
            "raylens: %s killed for memory on node %s (%s) by %s%s; post-mortem: %s",
            _victims_words(kill),
            printable(kill.node_id[:64]),
            printable(kill.host[:64]),
            "Ray's memory monitor" if kill.killer is Killer.RAY else "the kernel's OOM killer",
            " (raylens' own sampler among them; it is started again)" if sampler_killed else "",
            "not written" if path is None else printable(str(path)),
        )

    def _count_unbuilt(self, events: list[_Kill], now: float) -> None:
        for kill in events:
            self.ledger.count(kill.node_id, kill.killer, kill.kills)
        shown = ", ".join(
            f"{printable(kill.node_id[:16])} ({kill.kills})" for kill in events[:MAX_VICTIMS_LISTED]
        )
        more = len(events) - MAX_VICTIMS_LISTED
        _LOGGER.warning(
            "raylens: %d more kill events this cycle got no post-mortem (at most %d per cycle), "
            "counted: node (kills) %s%s",
            len(events),
            MAX_POSTMORTEMS_PER_CYCLE,
            shown,
            f" and {more} more" if more > 0 else "",
        )

    def _document(
        self,
        kill: _Kill,
        sample: NodeSample | None,
        now: float,
        phase: str | None,
        sampler_killed: bool,
    ) -> dict[str, Any]:
        growth = self.growth
        limit = None
        if growth is not None and sample is not None:
            limit = growth.kill_line.limit(sample.total)
        largest: Sequence[LargestProcess] = ()
        largest_at = None
        if self.largest_processes_of is not None and self._asks_left > 0 and not sampler_killed:
            self._asks_left -= 1
            answer = self.largest_processes_of(kill.node_id)
            if answer is not None:
                largest, largest_at = answer
        return build_postmortem(
            node_id=kill.node_id,
            host=kill.host,
            killer=kill.killer,
            wall_time=now,
            victims=kill.victims,
            kills=kill.kills,
            phase=phase,
            limit_bytes=limit,
            used_bytes=None if sample is None else sample.used,
            total_bytes=None if sample is None else sample.total,
            history=None
            if growth is None
            else growth.recent_history(kill.node_id, kill.monotonic_at),
            largest=largest,
            largest_sampled_at=largest_at,
            sampler_killed=sampler_killed,
            sources=kill.sources,
        )


def _sample_time(sample: NodeSample | None) -> float:
    if sample is None or sample.sampled_at is None:
        return 0.0
    return sample.sampled_at


def _victims_words(kill: _Kill) -> str:
    if not kill.victims:
        return "a worker" if kill.kills == 1 else f"{kill.kills} workers"
    words = ", ".join(_group_words(victim) for victim in kill.victims[:4])
    more = kill.kills - min(4, len(kill.victims))
    return f"{words} and {more} more" if more > 0 else words


def _group_words(victim: Victim) -> str:
    if victim.group is None:
        if victim.ray_name is not None:
            return f"worker '{printable(victim.ray_name[:80])}'"
        return "a worker of an unknown group"
    words = f"a worker of group '{printable(victim.group[:80])}'"
    details = [
        f"rank {victim.worker_rank}" if victim.worker_rank is not None else "",
        f"pid {victim.pid}" if victim.pid is not None else "",
    ]
    joined = ", ".join(d for d in details if d)
    return f"{words} ({joined})" if joined else words


class _HookedMonitor(OomSource, Protocol):
    def add_cycle_hook(self, hook: Any, *, on_stop: Any = None) -> None: ...


def attach_oom_watch(monitor: _HookedMonitor, watch: OomWatch | None = None) -> OomWatch:
    """Declare ``rl.host.oom_kills`` and run ``watch`` (default: no files) after every cycle."""
    watch = watch if watch is not None else OomWatch()
    register_oom_counter(watch.ledger)
    monitor.add_cycle_hook(watch)
    return watch
