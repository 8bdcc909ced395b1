"""Scripted memory over simulated time: :class:`MemoryScript` and its components.

Invariants a maintainer must keep:

- determinism: the bytes for a given ``t`` depend only on the script (its seed, the node,
  the group and the components), never on what was asked before or in which order: what
  one component draws never depends on how far the others were drawn;
- values are computed for arrays of times at once (numpy), never in a Python loop per
  sample, so a day of samples for a whole cluster stays cheap.

The components and how to use a script: ``docs/architecture.md``, *``raylens.distributed``
and ``raylens.simulation``*.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "Component",
    "Jitter",
    "Leak",
    "MemoryScript",
    "Pulse",
    "Sawtooth",
    "Spikes",
    "Steps",
    "realistic_script",
]

FloatArray = npt.NDArray[np.float64]
MIB = float(1 << 20)
GIB = float(1 << 30)
_BLOCK_S = 3_600.0


def _check(name: str, value: float, *, low: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r:.80}")
    if value < low or (strict and value == low):
        bound = "above" if strict else "at least"
        raise ValueError(f"{name} must be {bound} {low:g}, got {value!r:.80}")
    return float(value)


def _range(name: str, pair: tuple[float, float], *, low: float = 0.0) -> tuple[float, float]:
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise ValueError(f"{name} must be a (low, high) pair, got {pair!r:.80}")
    a = _check(f"{name}[0]", pair[0], low=low)
    b = _check(f"{name}[1]", pair[1], low=low)
    if b < a:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {pair!r:.80}")
    return a, b


@dataclass(frozen=True)
class Leak:
    """Memory that rises by ``rate`` bytes/s from ``start`` until ``stop`` (None: for ever)."""

    rate: float
    start: float = 0.0
    stop: float | None = None

    def __post_init__(self) -> None:
        _check("rate", self.rate, low=-math.inf)
        _check("start", self.start, low=-math.inf)
        if self.stop is not None and _check("stop", self.stop, low=-math.inf) < self.start:
            raise ValueError(
                f"stop must not be before start, got start={self.start!r}, stop={self.stop!r}"
            )


@dataclass(frozen=True)
class Sawtooth:
    """An allocator cycle of ``period`` seconds swinging ``amplitude`` bytes either side.

    Each tooth's length varies by up to ``jitter`` of the period (0.1: +-10 %). With
    ``restart_at_steps`` a :class:`Steps` component of the same part restarts the cycle at
    each phase boundary (memory built up in a phase is released with it).
    """

    amplitude: float
    period: float
    jitter: float = 0.0
    restart_at_steps: bool = False

    def __post_init__(self) -> None:
        _check("amplitude", self.amplitude)
        _check("period", self.period, strict=True)
        if not 0 <= _check("jitter", self.jitter) < 1:
            raise ValueError(f"jitter must be at least 0 and below 1, got {self.jitter!r}")


@dataclass(frozen=True)
class Steps:
    """Phases alternating between the base level and about ``height`` bytes above it.

    Each raised phase draws its height within ``spread`` of ``height``; phases last between
    ``every[0]`` and ``every[1]`` seconds.
    """

    height: float
    every: tuple[float, float]
    spread: float = 0.2

    def __post_init__(self) -> None:
        _check("height", self.height)
        low, _ = _range("every", self.every)
        if low <= 0:
            raise ValueError(f"every must be above 0 seconds, got {self.every!r}")
        if not 0 <= _check("spread", self.spread) < 1:
            raise ValueError(f"spread must be at least 0 and below 1, got {self.spread!r}")


@dataclass(frozen=True)
class Spikes:
    """Short transients, ``rate`` per second on average, of the given height and duration ranges."""

    rate: float
    height: tuple[float, float]
    duration: tuple[float, float]

    def __post_init__(self) -> None:
        _check("rate", self.rate)
        _range("height", self.height)
        low, _ = _range("duration", self.duration)
        if low <= 0:
            raise ValueError(f"duration must be above 0 seconds, got {self.duration!r}")


@dataclass(frozen=True)
class Pulse:
    """``height`` bytes more during ``[at, at + duration)``, once: a spike placed on purpose."""

    at: float
    duration: float
    height: float

    def __post_init__(self) -> None:
        _check("at", self.at, low=-math.inf)
        _check("duration", self.duration, strict=True)
        _check("height", self.height)


@dataclass(frozen=True)
class Jitter:
    """Reading-to-reading noise, uniform within ``+-amplitude`` bytes, fixed for each time."""

    amplitude: float

    def __post_init__(self) -> None:
        _check("amplitude", self.amplitude)


Component = Leak | Sawtooth | Steps | Spikes | Pulse | Jitter


class _Timeline:
    """The random events of one part, drawn in order as far as they are needed."""

    def __init__(self, components: Sequence[Component], seed: Sequence[int]) -> None:
        self.components = tuple(components)
        # One stream per component, so what is drawn never depends on how far the others
        # were drawn before.
        streams = np.random.SeedSequence(list(seed)).spawn(len(self.components) + 1)
        rngs = {id(c): np.random.default_rng(s) for c, s in zip(self.components, streams)}
        self.noise_key = int(np.random.default_rng(streams[-1]).integers(0, 2**63))
        self.until = 0.0
        self.steps = [c for c in self.components if isinstance(c, Steps)]
        self.saws = [c for c in self.components if isinstance(c, Sawtooth)]
        self.spikes = [c for c in self.components if isinstance(c, Spikes)]
        self.step_rngs = [rngs[id(c)] for c in self.steps]
        self.saw_rngs = [rngs[id(c)] for c in self.saws]
        self.spike_rngs = [rngs[id(c)] for c in self.spikes]
        self.step_times: list[list[float]] = [
            [float(r.uniform(0, s.every[1]))] for s, r in zip(self.steps, self.step_rngs)
        ]
        self.step_heights: list[list[float]] = [[] for _ in self.steps]
        self.teeth: list[list[float]] = [
            [-float(r.uniform(0, s.period))] for s, r in zip(self.saws, self.saw_rngs)
        ]
        self.spike_events: list[list[tuple[float, float, float]]] = [[] for _ in self.spikes]

    def cover(self, t_max: float) -> None:
        if t_max < self.until:
            return
        target = (math.floor(t_max / _BLOCK_S) + 1) * _BLOCK_S
        for steps, rng, times, heights in zip(
            self.steps, self.step_rngs, self.step_times, self.step_heights
        ):
            while times[-1] <= target:
                raised = len(heights) % 2 == 0
                size = steps.height * rng.uniform(1 - steps.spread, 1 + steps.spread)
                heights.append(float(size) if raised else 0.0)
                times.append(times[-1] + float(rng.uniform(*steps.every)))
        restarts = sorted(t for times in self.step_times for t in times)
        for saw, rng, teeth in zip(self.saws, self.saw_rngs, self.teeth):
            while teeth[-1] <= target:
                start = teeth[-1]
                end = start + saw.period * float(rng.uniform(1 - saw.jitter, 1 + saw.jitter))
                if saw.restart_at_steps and restarts:
                    first = int(np.searchsorted(restarts, start, side="right"))
                    if first < len(restarts) and restarts[first] < end:
                        end = restarts[first]
                teeth.append(end)
        for spikes, rng, events in zip(self.spikes, self.spike_rngs, self.spike_events):
            at = events[-1][0] if events else 0.0
            while spikes.rate > 0 and at <= target:
                at += float(rng.exponential(1.0 / spikes.rate))
                events.append(
                    (at, float(rng.uniform(*spikes.duration)), float(rng.uniform(*spikes.height)))
                )
        self.until = target

    def values(self, t: FloatArray) -> FloatArray:
        if len(t):
            self.cover(float(np.max(t)))
        out = np.zeros(len(t))
        steps_seen = saws_seen = spikes_seen = 0
        for component in self.components:
            if isinstance(component, Leak):
                stop = math.inf if component.stop is None else component.stop
                out += component.rate * (np.clip(t, component.start, stop) - component.start)
            elif isinstance(component, Steps):
                times = np.asarray(self.step_times[steps_seen][:-1])
                heights = np.concatenate([[0.0], self.step_heights[steps_seen]])
                out += heights[np.searchsorted(times, t, side="right")]
                steps_seen += 1
            elif isinstance(component, Sawtooth):
                teeth = np.asarray(self.teeth[saws_seen])
                k = np.maximum(np.searchsorted(teeth, t, side="right") - 1, 0)
                start, end = teeth[k], teeth[k + 1]
                out += component.amplitude * (2 * (t - start) / (end - start) - 1)
                saws_seen += 1
            elif isinstance(component, Spikes):
                if len(t):
                    out += _spike_values(self.spike_events[spikes_seen], t)
                spikes_seen += 1
            elif isinstance(component, Pulse):
                inside = (t >= component.at) & (t < component.at + component.duration)
                out += np.where(inside, component.height, 0.0)
            elif isinstance(component, Jitter):
                out += component.amplitude * (2 * _uniform(self.noise_key, t) - 1)
        return out


def _spike_values(events: list[tuple[float, float, float]], t: FloatArray) -> FloatArray:
    """The spikes' heights at each of ``t``; by slices when ``t`` is sorted, by masks otherwise."""
    out = np.zeros(len(t))
    ordered = len(t) < 2 or bool(np.all(t[1:] >= t[:-1]))
    low, high = float(np.min(t)), float(np.max(t))
    starts = [e[0] for e in events]
    first = int(np.searchsorted(starts, low - max((e[1] for e in events), default=0.0)))
    for at, duration, height in events[first:]:
        if at > high:
            break
        if at + duration <= low:
            continue
        if ordered:
            a = int(np.searchsorted(t, at, side="left"))
            b = int(np.searchsorted(t, at + duration, side="left"))
            out[a:b] += height
        else:
            out[(t >= at) & (t < at + duration)] += height
    return out


def _uniform(key: int, t: FloatArray) -> FloatArray:
    """A number in [0, 1) fixed for each (key, millisecond of t): splitmix64 of both."""
    with np.errstate(over="ignore"):
        z = (np.round(t * 1000).astype(np.int64).view(np.uint64) + np.uint64(key)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _name_key(name: str | None) -> int:
    return 0 if name is None else zlib.crc32(name.encode("utf-8", "surrogatepass")) + 1


class MemoryScript:
    """What each worker group on each node holds over time, and what the node holds besides.

    Nodes are indexed from 0. ``total`` (and ``cgroup_total``, when the node runs in a
    container with a lower limit) is what the node reports as its total memory.
    """

    def __init__(
        self, *, seed: int = 0, total: float = 64 * GIB, cgroup_total: float | None = None
    ) -> None:
        self.seed = int(seed)
        self.total = _check("total", total, strict=True)
        self.cgroup_total = (
            None if cgroup_total is None else _check("cgroup_total", cgroup_total, strict=True)
        )
        self._parts: dict[tuple[int, str | None], tuple[float, _Timeline]] = {}

    def set_group(self, node: int, group: str, *components: Component, base: float = 0.0) -> None:
        """Script worker group ``group`` on node ``node``: ``base`` bytes plus ``components``."""
        self._set(node, group, components, base)

    def set_other(self, node: int, *components: Component, base: float = 0.0) -> None:
        """Script what node ``node`` holds outside its worker groups."""
        self._set(node, None, components, base)

    def _set(
        self, node: int, group: str | None, components: Iterable[Component], base: float
    ) -> None:
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise ValueError(f"node must be a non-negative int, got {node!r:.80}")
        items = tuple(components)
        for item in items:
            if not isinstance(item, (Leak, Sawtooth, Steps, Spikes, Pulse, Jitter)):
                raise ValueError(f"not a memory component: {item!r:.80}")
        timeline = _Timeline(items, (self.seed, node, _name_key(group)))
        self._parts[(node, group)] = (_check("base", base, low=-math.inf), timeline)

    def nodes(self) -> list[int]:
        """Every node index with a scripted part."""
        return sorted({node for node, _ in self._parts})

    def group_names(self, node: int) -> list[str]:
        """The worker groups scripted on ``node``."""
        return sorted(g for n, g in self._parts if n == node and g is not None)

    def group_values(self, node: int, group: str | None, times: npt.ArrayLike) -> FloatArray:
        """Bytes of ``group`` (None: outside the groups) on ``node`` at each of ``times``."""
        t = np.asarray(times, dtype=np.float64)
        part = self._parts.get((node, group))
        if part is None:
            return np.zeros(len(t))
        base, timeline = part
        return base + timeline.values(t)

    def group_peak(
        self, node: int, group: str | None, start: float, end: float, resolution: float = 0.001
    ) -> float:
        """The most ``group`` held on ``node`` over ``[start, end]``, as the kernel's mark sees it.

        Evaluated every ``resolution`` seconds and at the start of every :class:`Pulse`
        inside the span, so a pulse at least that long is never missed.
        """
        if end < start:
            raise ValueError(f"end must not be before start, got start={start!r}, end={end!r}")
        _check("resolution", resolution, strict=True)
        times = [np.arange(start, end, resolution), np.asarray([end], dtype=np.float64)]
        part = self._parts.get((node, group))
        if part is not None:
            pulses = [c.at for c in part[1].components if isinstance(c, Pulse)]
            times.append(np.asarray([at for at in pulses if start <= at <= end], dtype=np.float64))
        grid = np.sort(np.concatenate(times))
        return float(np.max(self.group_values(node, group, grid)))

    def node_values(
        self, node: int, times: npt.ArrayLike
    ) -> tuple[FloatArray, dict[str, FloatArray]]:
        """The node's used bytes at each time, and each group's bytes."""
        groups = {g: self.group_values(node, g, times) for g in self.group_names(node)}
        used = self.group_values(node, None, times)
        for values in groups.values():
            used = used + values
        return used, groups

    def groups(self, node: int, t: float) -> dict[str, float]:
        """Each group's bytes on ``node`` at ``t``."""
        return {g: float(self.group_values(node, g, [t])[0]) for g in self.group_names(node)}

    def schedule(self, node: int, t: float) -> tuple[float, float]:
        """``(used, total)`` of ``node`` at ``t``: a :class:`SimulatedCluster` schedule."""
        used, _ = self.node_values(node, [t])
        total = self.total if self.cgroup_total is None else min(self.total, self.cgroup_total)
        return float(used[0]), total


def realistic_script(
    n_nodes: int,
    groups: Sequence[str] = ("policy", "rollout", "reference"),
    *,
    seed: int = 0,
    total: float = 64 * GIB,
    leaks: Mapping[tuple[int, str], Leak] | None = None,
    restart_at_steps: bool = False,
) -> MemoryScript:
    """A cluster whose every group has the noise RL training shows, plus the given leaks.

    Per group: 2 to 8 GiB of base, an allocator sawtooth of +-300 MiB with a period drawn
    from 30 s to 5 min (teeth +-10 %), phase steps of 2 GiB (+-20 %) every 2 to 8 minutes,
    spikes of 0.5 to 4 GiB lasting 1 to 5 s about once every 20 minutes, and +-4 MiB of
    jitter. Outside the groups each node holds 4 GiB with +-16 MiB of jitter.
    """
    script = MemoryScript(seed=seed, total=total)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
    leaks = dict(leaks or {})
    for node in range(n_nodes):
        script.set_other(node, Jitter(16 * MIB), base=4 * GIB)
        for group in groups:
            parts: list[Component] = [
                Sawtooth(300 * MIB, float(rng.uniform(30, 300)), 0.1, restart_at_steps),
                Steps(2 * GIB, (120.0, 480.0)),
                Spikes(1 / 1200, (0.5 * GIB, 4 * GIB), (1.0, 5.0)),
                Jitter(4 * MIB),
            ]
            leak = leaks.pop((node, group), None)
            if leak is not None:
                parts.append(leak)
            script.set_group(node, group, *parts, base=float(rng.uniform(2, 8)) * GIB)
    if leaks:
        raise ValueError(f"leaks name groups that are not scripted: {sorted(leaks)!r:.200}")
    return script
