"""Host-memory traces of RL jobs, written from how their memory behaves, with the truth attached.

Each trace is one node sampled every second: its worker groups (``policy``, ``rollout``,
``reference``), the memory outside them (the object store, Ray's own processes) and the
node's used memory, with gaps where samples are missing. A trace belongs to a *family*: a
workload whose memory is built from the components below, each drawn with its own random
parameters. Leak families add a leak to one group, and say which, from when and how fast.

Components, each from first principles of what takes host memory in an RL job:

- allocator arenas that fill up to a plateau after a process starts (a saturating curve);
- fragmentation that creeps at a slowing rate and is given back by a trim or a compaction;
- a garbage-collected heap's sawtooth (a steady climb, then a release);
- phase steps (generation, training, refit) whose levels differ by 0.5-20 GiB and that take
  1-60 s to change (pinned copies and weights moved at about 1 GB/s);
- checkpoint host copies of 5-40 GiB, held 10-120 s;
- an inference engine's sleep and wake (its weights offloaded to host memory while asleep);
- the object store filling during generation and freed after training;
- a replay buffer warming up over 20-60 minutes (new distinct items become rarer as it fills);
- sample jitter, gaps in sampling and worker restarts (memory drops, then warms up again).

:data:`TUNE_FAMILIES` are the families a detector may be tuned on; :data:`TEST_FAMILIES`
are only ever measured. They share no family: the test side brings workloads (object-store
fills, replay warm-up, slow weight loading, checkpoints, leaks mid-run and only while
training, slow leaks over half a day) the tune side does not show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

__all__ = [
    "GIB",
    "GROUPS",
    "MIB",
    "TEST_FAMILIES",
    "TUNE_FAMILIES",
    "Trace",
    "make_trace",
]

MIB = float(1 << 20)
GIB = float(1 << 30)
GROUPS = ("policy", "rollout", "reference")
_MIB_MIN = MIB / 60.0

FloatArray = npt.NDArray[np.float64]
Rng = np.random.Generator


@dataclass
class Trace:
    """One node's samples and the truth about them.

    ``times`` are seconds (gaps removed); ``groups`` maps each group to its bytes and
    ``other`` is the memory outside them; ``used`` is the node's used memory. ``leak_group``
    is the leaking group (None for a trace without a leak), leaking from ``leak_start`` at
    ``leak_rate`` bytes/s on average (a leak that only runs while training averages its
    rate over the phases). ``leak`` is the bytes the leak has added at each sample.
    ``total`` is the node's memory; ``phases`` every phase boundary (each training phase's start
    and end), as ``raylens.phase`` would mark them.
    """

    family: str
    seed: int
    times: FloatArray
    groups: dict[str, FloatArray]
    other: FloatArray
    used: FloatArray
    total: float
    leak_group: str | None = None
    leak_start: float = float("inf")
    leak_rate: float = 0.0
    leak: FloatArray = field(default_factory=lambda: np.zeros(0))
    phases: FloatArray = field(default_factory=lambda: np.zeros(0))

    @property
    def hours(self) -> float:
        return float(self.times[-1] - self.times[0]) / 3600.0


# --- components ---------------------------------------------------------------------


def _saturating(t: FloatArray, start: float, amount: float, tau: float) -> FloatArray:
    since = np.clip(t - start, 0.0, None)
    return np.where(t >= start, amount * (1.0 - np.exp(-since / tau)), 0.0)


def arenas(t: FloatArray, rng: Rng, restarts: FloatArray) -> FloatArray:
    """Arenas filling to a plateau after each (re)start of the process."""
    out = np.zeros_like(t)
    starts = np.concatenate(([t[0]], restarts))
    ends = np.concatenate((restarts, [t[-1] + 1]))
    for a, b in zip(starts, ends):
        amount = rng.uniform(0.3, 3.0) * GIB
        tau = rng.uniform(60, 900)
        inside = (t >= a) & (t < b)
        out[inside] = amount * (1.0 - np.exp(-(t[inside] - a) / tau))
    return out


def creep(t: FloatArray, rng: Rng) -> FloatArray:
    """Fragmentation creeping at a slowing rate (1-8 MiB/min at first), given back after 30-90 min."""
    out = np.zeros_like(t)
    at = t[0] + rng.uniform(0, 1800)
    while at < t[-1]:
        length = rng.uniform(1800, 5400)
        rate = rng.uniform(1, 8) * _MIB_MIN
        tau = rng.uniform(600, 1800)
        inside = (t >= at) & (t < at + length)
        out[inside] = rate * tau * (1.0 - np.exp(-(t[inside] - at) / tau))
        at += length + rng.uniform(60, 1800)
    return out


def sawtooth(
    t: FloatArray, rng: Rng, low: float, high: float, periods: tuple[float, float]
) -> FloatArray:
    """A heap that climbs by ``low``-``high`` bytes and releases it, every 20 s to 5 min (varying)."""
    out = np.zeros_like(t)
    at = t[0] - rng.uniform(0, periods[1])
    while at < t[-1]:
        period = rng.uniform(*periods)
        amount = rng.uniform(low, high)
        inside = (t >= at) & (t < at + period)
        out[inside] = amount * (t[inside] - at) / period
        at += period
    return out


def phases(
    t: FloatArray, rng: Rng, *, step: tuple[float, float], ramp: tuple[float, float]
) -> tuple[FloatArray, list[tuple[float, float]]]:
    """Generation and training alternating every 2-15 min; levels differ by ``step`` bytes, changed over ``ramp`` s.

    Returns the memory and the (start, end) of each training phase.
    """
    out = np.zeros_like(t)
    training: list[tuple[float, float]] = []
    at = t[0]
    level = 0.0
    train = False
    while at < t[-1]:
        length = rng.uniform(120, 900)
        target = rng.uniform(*step) if train else 0.0
        change = rng.uniform(*ramp)
        inside = (t >= at) & (t < at + length)
        since = t[inside] - at
        out[inside] = level + (target - level) * np.clip(since / change, 0.0, 1.0)
        if train:
            training.append((at, at + length))
        level = target
        at += length
        train = not train
    return out, training


def checkpoints(t: FloatArray, rng: Rng) -> FloatArray:
    """Host copies of 5-40 GiB every 20-60 min, copied in over 5-30 s and held 10-120 s."""
    out = np.zeros_like(t)
    at = t[0] + rng.uniform(600, 3600)
    while at < t[-1]:
        size = rng.uniform(5, 40) * GIB
        fill = rng.uniform(5, 30)
        hold = rng.uniform(10, 120)
        inside = (t >= at) & (t < at + fill + hold)
        out[inside] = size * np.clip((t[inside] - at) / fill, 0.0, 1.0)
        at += rng.uniform(1200, 3600)
    return out


def sleep_wake(t: FloatArray, rng: Rng) -> FloatArray:
    """An inference engine's weights (2-16 GiB) held in host memory while it sleeps."""
    weights = rng.uniform(2, 16) * GIB
    out = np.zeros_like(t)
    at = t[0] + rng.uniform(0, 600)
    while at < t[-1]:
        awake = rng.uniform(120, 900)
        asleep = rng.uniform(120, 900)
        move = rng.uniform(5, 20)
        start = at + awake
        inside = (t >= start) & (t < start + asleep)
        rise = np.clip((t[inside] - start) / move, 0.0, 1.0)
        fall = np.clip((start + asleep - t[inside]) / move, 0.0, 1.0)
        out[inside] = weights * np.minimum(rise, fall)
        at = start + asleep
    return out


def object_store(t: FloatArray, rng: Rng, training: list[tuple[float, float]]) -> FloatArray:
    """Rollouts fill the object store during generation (3-12 min) and training frees it."""
    out = np.zeros_like(t)
    previous_end = t[0]
    for start, end in training:
        fill_from = max(previous_end, start - rng.uniform(180, 720))
        amount = rng.uniform(2, 20) * GIB
        filling = (t >= fill_from) & (t < start)
        chunks = np.floor((t[filling] - fill_from) / rng.uniform(5, 30))
        span = max(start - fill_from, 1.0)
        out[filling] = amount * np.minimum(1.0, chunks * rng.uniform(5, 30) / span)
        held = (t >= start) & (t < end)
        freed_at = start + rng.uniform(0.3, 1.0) * (end - start)
        out[held & (t < freed_at)] = amount
        previous_end = end
    return out


def replay_warmup(t: FloatArray, rng: Rng) -> FloatArray:
    """A replay buffer of 2-16 GiB warming up over 20-60 min from the job's start."""
    amount = rng.uniform(2, 16) * GIB
    length = rng.uniform(1200, 3600)
    return _saturating(t, t[0] + rng.uniform(0, 300), amount, length / 3.0)


def restart_times(t: FloatArray, rng: Rng, every: tuple[float, float]) -> FloatArray:
    times = []
    at = t[0] + rng.uniform(*every)
    while at < t[-1]:
        times.append(at)
        at += rng.uniform(*every)
    return np.array(times)


def restarted(values: FloatArray, t: FloatArray, restarts: FloatArray, rng: Rng) -> FloatArray:
    """``values`` with the process down for 10-60 s at each restart: NaN there, which the
    node's assembly turns into a process holding nothing yet (its base memory gone too)."""
    out = values.copy()
    for at in restarts:
        out[(t >= at) & (t < at + rng.uniform(10, 60))] = np.nan
    return out


# --- leaks --------------------------------------------------------------------------


def leak_curve(
    t: FloatArray,
    start: float,
    rate: float,
    training: list[tuple[float, float]] | None = None,
) -> tuple[FloatArray, float]:
    """Bytes a leak of ``rate`` bytes/s has added by each sample, and its average rate.

    With ``training``, the leak runs only inside those phases (at ``rate`` there).
    """
    if training is None:
        return np.clip(t - start, 0.0, None) * rate, rate
    active = np.zeros_like(t)
    for a, b in training:
        active[(t >= max(a, start)) & (t < b)] = 1.0
    dt = np.diff(t, prepend=t[0])
    added = np.cumsum(active * dt) * rate
    after = t >= start
    span = float(t[-1] - start)
    average = float(added[-1]) / span if span > 0 else rate
    return np.where(after, added, 0.0), average


# --- families -----------------------------------------------------------------------


def _jitter(rng: Rng, n: int, sigma: float) -> FloatArray:
    return rng.normal(0.0, sigma, n)


def _assemble(
    family: str,
    seed: int,
    rng: Rng,
    t: FloatArray,
    groups: dict[str, FloatArray],
    other: FloatArray,
    *,
    gap_share: float = 0.01,
    leak: tuple[str, float, float, FloatArray] | None = None,
) -> Trace:
    """Add bases and jitter, cut gaps, add up the node."""
    n = len(t)
    bases = {
        "policy": rng.uniform(8, 24),
        "rollout": rng.uniform(6, 20),
        "reference": rng.uniform(2, 8),
    }
    parts = {}
    for name, values in groups.items():
        part = values + bases[name] * GIB + _jitter(rng, n, rng.uniform(2, 16) * MIB)
        down = np.isnan(values)
        part[down] = 64 * MIB + _jitter(rng, int(down.sum()), 2 * MIB)
        parts[name] = part
    other = other + rng.uniform(3, 8) * GIB + _jitter(rng, n, rng.uniform(4, 16) * MIB)
    leak_added = np.zeros(n)
    leak_group: str | None = None
    leak_start, leak_rate = float("inf"), 0.0
    if leak is not None:
        leak_group, leak_start, leak_rate, leak_added = leak
        parts[leak_group] = parts[leak_group] + leak_added
    keep = np.ones(n, dtype=bool)
    at = 0
    while gap_share > 0:
        at += int(rng.exponential(120 / gap_share))
        if at >= n:
            break
        keep[at : at + int(rng.uniform(1, 120))] = False
    used = other + sum(parts.values())
    return Trace(
        family,
        seed,
        t[keep],
        {name: values[keep] for name, values in parts.items()},
        other[keep],
        used[keep],
        total=512 * GIB,
        leak_group=leak_group,
        leak_start=leak_start,
        leak_rate=leak_rate,
        leak=leak_added[keep],
    )


def _colocated(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """GRPO with colocated generation: policy phases and heap, an engine sleeping and waking."""
    steps, training = phases(
        t, rng, step=(0.5, 4.0) if rng.random() < 0.5 else (0.5, 2.0), ramp=(1, 10)
    )
    policy = (
        steps + sawtooth(t, rng, 0.1 * GIB, 0.6 * GIB, (20, 120)) + arenas(t, rng, np.array([]))
    )
    rollout = sleep_wake(t, rng) + sawtooth(t, rng, 0.05 * GIB, 0.3 * GIB, (30, 300))
    reference = arenas(t, rng, np.array([])) + sawtooth(t, rng, 0.05 * GIB, 0.2 * GIB, (30, 90))
    return (
        {"policy": policy, "rollout": rollout, "reference": reference},
        np.zeros_like(t),
        training,
    )


def _big_heaps(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """Large garbage-collected heaps: 4-8 GiB sawtooth, periods of 30 s to 5 min."""
    steps, training = phases(t, rng, step=(0.5, 2.0), ramp=(1, 5))
    policy = steps + sawtooth(t, rng, 4 * GIB, 8 * GIB, (30, 300))
    rollout = sawtooth(t, rng, 1 * GIB, 4 * GIB, (20, 240))
    reference = sawtooth(t, rng, 0.2 * GIB, 1 * GIB, (30, 120))
    return (
        {"policy": policy, "rollout": rollout, "reference": reference},
        np.zeros_like(t),
        training,
    )


def _fragmenting(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """Fragmentation creeping and given back in every group, over modest heaps."""
    steps, training = phases(t, rng, step=(0.5, 3.0), ramp=(1, 20))
    groups = {
        name: creep(t, rng) + sawtooth(t, rng, 0.05 * GIB, 0.5 * GIB, (20, 180)) for name in GROUPS
    }
    groups["policy"] = groups["policy"] + steps
    return groups, creep(t, rng), training


def _restarting(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """Workers restarting every 1-3 h and warming up again, samples missing now and then."""
    steps, training = phases(t, rng, step=(0.5, 3.0), ramp=(1, 10))
    groups = {}
    for name in GROUPS:
        again = restart_times(t, rng, (3600, 10800))
        body = arenas(t, rng, again) + sawtooth(t, rng, 0.1 * GIB, 0.8 * GIB, (20, 200))
        if name == "policy":
            body = body + steps
        groups[name] = restarted(body, t, again, rng)
    return groups, np.zeros_like(t), training


def _sleepy(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """Inference engines sleeping and waking in two groups, a quiet trainer."""
    steps, training = phases(t, rng, step=(0.5, 1.5), ramp=(1, 5))
    groups = {
        "policy": steps + sawtooth(t, rng, 0.1 * GIB, 0.4 * GIB, (30, 120)),
        "rollout": sleep_wake(t, rng) + sawtooth(t, rng, 0.1 * GIB, 0.3 * GIB, (30, 120)),
        "reference": sleep_wake(t, rng),
    }
    return groups, np.zeros_like(t), training


def _checkpointing(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """Checkpoints of 5-40 GiB held 10-120 s, slow phase steps, arenas."""
    steps, training = phases(t, rng, step=(1.0, 6.0), ramp=(10, 60))
    groups = {
        "policy": steps + checkpoints(t, rng) + sawtooth(t, rng, 0.2 * GIB, 1.0 * GIB, (30, 200)),
        "rollout": arenas(t, rng, np.array([])) + sawtooth(t, rng, 0.1 * GIB, 0.5 * GIB, (30, 150)),
        "reference": checkpoints(t, rng) * 0.25,
    }
    return groups, np.zeros_like(t), training


def _object_store(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """Rollouts filling the object store during generation, freed after training."""
    steps, training = phases(t, rng, step=(0.5, 3.0), ramp=(1, 15))
    groups = {
        "policy": steps + sawtooth(t, rng, 0.2 * GIB, 1.5 * GIB, (30, 240)),
        "rollout": sawtooth(t, rng, 0.1 * GIB, 0.6 * GIB, (20, 120)),
        "reference": arenas(t, rng, np.array([])),
    }
    return groups, object_store(t, rng, training), training


def _warming(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """A replay buffer warming up in the trainer, arenas filling, workers restarting."""
    steps, training = phases(t, rng, step=(0.5, 2.0), ramp=(1, 10))
    again = restart_times(t, rng, (7200, 14400))
    groups = {
        "policy": steps + replay_warmup(t, rng) + sawtooth(t, rng, 0.1 * GIB, 0.5 * GIB, (20, 150)),
        "rollout": restarted(arenas(t, rng, again), t, again, rng),
        "reference": replay_warmup(t, rng) * 0.5,
    }
    return groups, creep(t, rng), training


def _weights_loading(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """Phase steps of 5-20 GiB moved at about 1 GB/s (20-60 s), and weight refits."""
    steps, training = phases(t, rng, step=(5.0, 20.0), ramp=(20, 60))
    refit, _ = phases(t, rng, step=(2.0, 8.0), ramp=(2, 30))
    groups = {
        "policy": steps + sawtooth(t, rng, 0.2 * GIB, 1.0 * GIB, (30, 200)),
        "rollout": refit + sleep_wake(t, rng),
        "reference": arenas(t, rng, np.array([])),
    }
    return groups, np.zeros_like(t), training


def _quiet(
    rng: Rng, t: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]:
    """A long, steady run: small heaps, rare phase changes."""
    steps, training = phases(t, rng, step=(0.5, 1.0), ramp=(1, 5))
    groups = {name: sawtooth(t, rng, 0.02 * GIB, 0.1 * GIB, (30, 300)) for name in GROUPS}
    groups["policy"] = groups["policy"] + steps
    return groups, np.zeros_like(t), training


Workload = Callable[
    [Rng, FloatArray], tuple[dict[str, FloatArray], FloatArray, list[tuple[float, float]]]
]


@dataclass(frozen=True)
class Family:
    """A workload, and the leak (if any) put in one of its groups."""

    name: str
    workload: Workload
    hours: float
    leak: str | None = None  # "constant", "mid_run", "training", "slow"


TUNE_FAMILIES = (
    Family("colocated", _colocated, 8.0),
    Family("big_heaps", _big_heaps, 8.0),
    Family("fragmenting", _fragmenting, 8.0),
    Family("restarting", _restarting, 8.0),
    Family("sleepy", _sleepy, 8.0),
    Family("leak_constant", _colocated, 3.0, leak="constant"),
    Family("leak_under_heap", _big_heaps, 3.0, leak="mid_run"),
    Family("leak_training_sleepy", _sleepy, 4.0, leak="training"),
)
TEST_FAMILIES = (
    Family("checkpointing", _checkpointing, 8.0),
    Family("object_store", _object_store, 8.0),
    Family("warming", _warming, 8.0),
    Family("weights_loading", _weights_loading, 8.0),
    Family("quiet", _quiet, 8.0),
    Family("leak_mid_run", _object_store, 4.0, leak="mid_run"),
    Family("leak_in_training", _checkpointing, 4.0, leak="training"),
    Family("leak_mid_run_loading", _weights_loading, 4.0, leak="mid_run"),
    Family("leak_slow", _quiet, 12.0, leak="slow"),
)

#: Leak rates drawn for the leak families, MiB/min (the slow family uses 1-3).
LEAK_RATES_MIB_MIN = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)


def make_trace(family: Family, seed: int, *, leak_rate_mib_min: float | None = None) -> Trace:
    """One trace of ``family`` drawn with ``seed``; leak families take ``leak_rate_mib_min``."""
    rng = np.random.default_rng([seed, sum(map(ord, family.name))])
    t = np.arange(0.0, family.hours * 3600.0)
    groups, other, training = family.workload(rng, t)
    leak = None
    if family.leak is not None:
        rate = (leak_rate_mib_min or float(rng.choice(LEAK_RATES_MIB_MIN))) * _MIB_MIN
        group = str(rng.choice(GROUPS))
        start = {
            "constant": 0.0,
            "mid_run": rng.uniform(1800, 5400),
            "training": rng.uniform(600, 3600),
            "slow": rng.uniform(0, 1800),
        }[family.leak]
        if family.leak == "training":
            # Faster while training, so that the leak averages the rate asked for.
            _, share = leak_curve(t, start, 1.0, training)
            curve, average = leak_curve(t, start, rate / max(share, 0.1), training)
        else:
            curve, average = leak_curve(t, start, rate)
        leak = (group, start, average, curve)
    trace = _assemble(family.name, seed, rng, t, groups, other, leak=leak)
    boundaries = sorted({at for phase in training for at in phase if t[0] < at <= t[-1]})
    return replace(trace, phases=np.array(boundaries, dtype=np.float64))
