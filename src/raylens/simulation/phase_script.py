"""Scripted phases over simulated time: which phase a simulated job is in at ``t``.

A :class:`PhaseScript` lists named phases as ``(name, start, end)`` seconds since the
script's start, in order and without overlap, optionally repeating every ``repeat_s``
seconds (a training loop: generation, training, refit, again). A
:class:`~raylens.simulation.simulated_cluster.SimulatedCluster` given one publishes the
phase in progress in its cluster's store, as a driver inside ``raylens.phase`` does, and a
test walks :meth:`PhaseScript.boundaries` to begin and end phases on simulated time.

Spikes between two samples are scripted with
:class:`~raylens.simulation.memory_script.Pulse` in a
:class:`~raylens.simulation.memory_script.MemoryScript`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from raylens.telemetry.phases.memory import check_phase_name

__all__ = ["PhaseScript", "ScriptedPhase"]


@dataclass(frozen=True)
class ScriptedPhase:
    """One phase: its name and its ``[start, end)`` seconds."""

    name: str
    start: float
    end: float


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r:.80}")
    return float(value)


class PhaseScript:
    """Named phases over simulated time; see the module docstring.

    Raises TypeError or ValueError, naming the fault, for a bad phase name, a phase that
    ends before it starts or overlaps the one before, or a ``repeat_s`` shorter than the
    phases it repeats.
    """

    def __init__(
        self, phases: Iterable[tuple[str, float, float]], *, repeat_s: float | None = None
    ) -> None:
        checked: list[ScriptedPhase] = []
        for entry in phases:
            if not isinstance(entry, tuple) or len(entry) != 3:
                raise ValueError(
                    f"each phase must be a (name, start, end) tuple, got {entry!r:.80}"
                )
            name, start, end = entry
            phase = ScriptedPhase(
                check_phase_name(name), _seconds("start", start), _seconds("end", end)
            )
            if phase.end <= phase.start:
                raise ValueError(f"phase {name!r} must end after it starts, got {entry!r}")
            if checked and phase.start < checked[-1].end:
                raise ValueError(
                    f"phase {name!r} starts at {phase.start:g} s, before phase "
                    f"{checked[-1].name!r} ends at {checked[-1].end:g} s: phases do not overlap"
                )
            checked.append(phase)
        self.phases = tuple(checked)
        if repeat_s is not None:
            repeat_s = _seconds("repeat_s", repeat_s)
            last_end = self.phases[-1].end if self.phases else 0.0
            if repeat_s <= 0 or repeat_s < last_end:
                raise ValueError(
                    f"repeat_s must be positive and at least the last phase's end "
                    f"({last_end:g} s), got {repeat_s!r}"
                )
        self.repeat_s = repeat_s

    def phase_at(self, t: float) -> str | None:
        """The phase in progress at ``t``, or None between phases."""
        if self.repeat_s is not None and t >= 0:
            t = t % self.repeat_s
        for phase in self.phases:
            if phase.start <= t < phase.end:
                return phase.name
        return None

    def boundaries(self, until: float) -> Iterator[tuple[float, str, str]]:
        """``(t, "begin" or "end", name)`` in time order, every boundary before ``until``."""
        offset = 0.0
        while True:
            for phase in self.phases:
                for t, kind in ((phase.start, "begin"), (phase.end, "end")):
                    if offset + t >= until:
                        return
                    yield offset + t, kind, phase.name
            if self.repeat_s is None or not self.phases:
                return
            offset += self.repeat_s
