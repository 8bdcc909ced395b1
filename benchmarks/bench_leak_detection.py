"""How well raylens' growth engine finds leaks in realistic noise, on simulated time.

The cluster is :func:`raylens.simulation.memory_script.realistic_script`: ``--nodes`` nodes
(64) with three worker groups each, sampled every second. Every group has an allocator
sawtooth of +-300 MiB with its own period between 30 s and 5 min, phase steps of 2 GiB
(+-20 %) up and back down every 2 to 8 minutes, spikes of 0.5 to 4 GiB for 1 to 5 s about
every 20 minutes, and +-4 MiB of jitter; each node holds 4 GiB (+-16 MiB) outside its groups.
Samples go to :class:`raylens.telemetry.history.MemoryHistory` with the default settings
(10 min window) through ``record_node_many``, a minute of samples per call, so nothing
sleeps: a simulated day takes seconds.

Rows:

- detection of a 50 MiB/min and of a 5 MiB/min leak in one group on one node, starting
  20 minutes in: the delay until that group is *growing* with a growth figure within 25 %
  of the truth. ``--trials`` runs with different seeds (so different sawtooth periods for
  the leaking group); the other nodes cannot change a group's figures, so these runs
  simulate the leaking node alone.
- time-to-limit error once the leaking node is flagged: raylens' time to the kill line
  (64 GiB x 0.95) against (line - used) / true rate, over the 50 MiB/min trials, at every
  fit (one a minute) from :data:`SETTLED_AFTER_S` (5 minutes, half the window) after the
  node's first flag to the end of the run (70 min after the leak starts). A fit where the
  node has no time to limit counts as a miss (an infinite error). The same from the first
  flag on is printed too: a flag can come while the window holds only one or two troughs
  past the leak's start, when the rate since then is not yet determined.
- false flags: growing spells begun by any series (groups, the memory outside them) or
  node over ``--hours`` (24) simulated hours of the whole cluster without a leak; and the
  same for an eighth of the nodes whose allocator cycles restart at every phase step
  (memory built up in a phase is released with it), the hardest case for the fit.
- CPU per node per cycle: thread CPU time of ``record_node`` called once per node per
  second (one cycle) for 20 simulated minutes on the whole cluster, fits included, and of
  the five-minute ``record_node_many`` calls and node reads of the false-flag run.
- memory: ``tracemalloc`` of a history of 1,000 nodes x 8 groups at one sample a second,
  after a full window (its steady size: buckets and the rate rings are allocated up
  front, and the sample buffers hold one window).

Run: ``.venv/bin/python benchmarks/bench_leak_detection.py [--nodes 64] [--hours 24]
[--trials 8] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence

import numpy as np

from raylens.simulation.memory_script import GIB, MIB, Leak, realistic_script
from raylens.telemetry.history import DEFAULT_HORIZON_S, GrowthSettings, MemoryHistory, kill_line

GROUPS = ("policy", "rollout", "reference")
MINUTE = 60
LEAK_START_S = 1_200.0
RUN_AFTER_LEAK_S = 4_200.0
TOTAL = 64 * GIB
LIMIT = kill_line(TOTAL)
#: How long after the node's first flag the time-to-limit target applies.
SETTLED_AFTER_S = 300.0


def _per_min(rate_bytes_s: float) -> str:
    return f"{rate_bytes_s / MIB * 60:.1f} MiB/min"


def detection_trial(
    rate: float, seed: int
) -> tuple[float | None, float | None, list[tuple[float, float]]]:
    """(delay s, growth at detection, (s since the node's first flag, time-to-limit error) at
    every fit from that flag on) for one leak."""
    leak = Leak(rate, start=LEAK_START_S)
    script = realistic_script(1, GROUPS, seed=seed, total=TOTAL, leaks={(0, "policy"): leak})
    history = MemoryHistory()
    end = LEAK_START_S + RUN_AFTER_LEAK_S
    delay = growth_at = None
    ttl_errors: list[tuple[float, float]] = []
    flagged_at: float | None = None
    for start in np.arange(0.0, end, MINUTE):
        t = np.arange(start, start + MINUTE)
        used, groups = script.node_values(0, t)
        history.record_node_many("n0", t, used, groups)
        now = float(t[-1])
        view = history.node("n0")
        assert view is not None
        policy = view.groups.get("policy")
        if (
            delay is None
            and now >= LEAK_START_S
            and policy is not None
            and policy.growing
            and policy.growth is not None
            and abs(policy.growth - rate) <= 0.25 * rate
        ):
            delay, growth_at = now - LEAK_START_S, policy.growth
        if flagged_at is None and view.growing and now >= LEAK_START_S:
            flagged_at = now
        if flagged_at is not None and view.used is not None and LIMIT is not None:
            estimate = view.time_to_limit(LIMIT)
            truth = (LIMIT - view.used) / rate
            error = float("inf") if estimate is None else abs(estimate - truth) / truth
            ttl_errors.append((now - flagged_at, error))
    return delay, growth_at, ttl_errors


def false_flags(
    nodes: int, hours: float, seed: int, *, restart: bool = False
) -> tuple[int, list[str], float, int]:
    """(growing spells begun, where, CPU s recording and reading, node-cycles) over ``hours``.

    Samples go in five minutes per call; every series counts its growing spells itself, so
    none is missed between reads. Nodes are read after each call.
    """
    script = realistic_script(nodes, GROUPS, seed=seed, total=TOTAL, restart_at_steps=restart)
    history = MemoryHistory()
    node_was = [False] * nodes
    events: list[str] = []
    cpu = 0.0
    chunk = 5 * MINUTE
    for hour in range(math.ceil(hours)):
        t_hour = np.arange(hour * 3_600.0, min(hours, hour + 1) * 3_600.0)
        data = [script.node_values(node, t_hour) for node in range(nodes)]
        for first in range(0, len(t_hour), chunk):
            t = t_hour[first : first + chunk]
            began = time.thread_time()
            for node in range(nodes):
                used, groups = data[node]
                parts = {g: v[first : first + chunk] for g, v in groups.items()}
                history.record_node_many(f"n{node}", t, used[first : first + chunk], parts)
            views = [history.node(f"n{node}") for node in range(nodes)]
            cpu += time.thread_time() - began
            for node, view in enumerate(views):
                assert view is not None
                if view.growing and not node_was[node]:
                    events.append(f"node {node} at {t[-1] / 3600:.2f} h")
                node_was[node] = view.growing
    for node in range(nodes):
        view = history.node(f"n{node}")
        assert view is not None
        series = dict(view.groups)
        if view.other is not None:
            series["(other)"] = view.other
        for name, part in series.items():
            if part.spells:
                events.append(f"{name} on node {node}: {part.spells} spell(s)")
    return len(events), events, cpu, int(nodes * hours * 3_600)


def cpu_per_cycle(nodes: int, seconds: int, seed: int) -> float:
    """Thread CPU seconds per node per cycle of record_node, one call per node per second."""
    script = realistic_script(nodes, GROUPS, seed=seed, total=TOTAL)
    t = np.arange(0.0, float(seconds))
    data = [script.node_values(node, t) for node in range(nodes)]
    samples = [(used.tolist(), {g: v.tolist() for g, v in groups.items()}) for used, groups in data]
    names = [f"n{node}" for node in range(nodes)]
    history = MemoryHistory()
    began = time.thread_time()
    for k in range(seconds):
        now = float(k)
        for node in range(nodes):
            used, groups = samples[node]
            history.record_node(names[node], now, used[k], {g: v[k] for g, v in groups.items()})
    return (time.thread_time() - began) / (nodes * seconds)


def memory_1000x8(seed: int) -> tuple[int, int]:
    """(tracemalloc bytes, array bytes) of 1,000 nodes x 8 groups after a full window.

    Fitting is off while tracing (``refit_every_s`` at the horizon), because tracing every
    temporary of every fit would take minutes; a fit keeps nothing beyond a few floats, and
    what it keeps (the ring of confirmed rates) is allocated with the series.
    """
    groups = tuple(f"g{k}" for k in range(8))
    t = np.arange(0.0, 660.0)
    rng = np.random.default_rng(seed)
    base = rng.uniform(1, 8, size=(1_000, 8)) * GIB
    wiggle = np.sin(t / 37.0) * 100 * MIB
    parts = [{g: base[node, k] + wiggle for k, g in enumerate(groups)} for node in range(1_000)]
    used = [sum(p.values()) + 4 * GIB for p in parts]
    settings = GrowthSettings(refit_every_s=DEFAULT_HORIZON_S)
    tracemalloc.start()
    history = MemoryHistory(settings)
    for node in range(1_000):
        history.record_node_many(f"n{node}", t, used[node], parts[node])
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return size, history.nbytes()


def _error_summary(errors: Sequence[float]) -> str:
    finite = sorted(e for e in errors if e != float("inf"))
    if not finite:
        return f"no figure at any of {len(errors)} fits"
    detail = (
        f"median {statistics.median(finite):.1%}, 95th percentile"
        f" {finite[int(0.95 * (len(finite) - 1))]:.1%}, worst {finite[-1]:.1%}"
        f" over {len(errors)} fits"
    )
    gaps = len(errors) - len(finite)
    return detail + (f"; {gaps} fits without a figure" if gaps else "")


def _summary(delays: Sequence[float | None], target: float) -> str:
    found = sorted(d for d in delays if d is not None)
    missed = len(delays) - len(found)
    within = sum(d <= target for d in found)
    if not found:
        return f"none detected in {len(delays)} runs"
    text = (
        f"median {statistics.median(found) / 60:.1f} min, worst {found[-1] / 60:.1f} min;"
        f" {within}/{len(delays)} within {target / 60:.0f} min"
    )
    return text + (f"; {missed} not found in 70 min" if missed else "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    rows: list[tuple[str, str, str]] = []

    ttl_errors: list[tuple[float, float]] = []
    for rate, target in ((50 * MIB / 60, 600.0), (5 * MIB / 60, 3_600.0)):
        delays, misses = [], []
        for trial in range(args.trials):
            delay, growth, errors = detection_trial(rate, args.seed * 1000 + trial)
            delays.append(delay)
            if growth is not None:
                misses.append(abs(growth - rate) / rate)
            if rate > 10 * MIB / 60:
                ttl_errors.extend(errors)
        detail = _summary(delays, target)
        if misses:
            detail += f"; growth off by {max(misses):.0%} at most when found"
        rows.append(
            (f"{_per_min(rate)} leak, one group, one node", f"within {target / 60:.0f} min", detail)
        )
    if ttl_errors:
        settled = [e for since, e in ttl_errors if since >= SETTLED_AFTER_S]
        detail = _error_summary(settled)
        early = [e for _, e in ttl_errors]
        detail += (
            f" (from the first flag on: worst {max(early):.1%},"
            f" {sum(e > 0.25 for e in early)} of {len(early)} fits over 25 %)"
        )
        rows.append(
            (
                f"time-to-limit error, node flagged {SETTLED_AFTER_S / 60:.0f} min or more",
                "<= 25 %",
                detail,
            )
        )

    count, events, cpu, node_cycles = false_flags(args.nodes, args.hours, args.seed)
    detail = f"{count} over {args.nodes} nodes x ({len(GROUPS)} groups + other + node)"
    if events:
        detail += ": " + ", ".join(events[:5]) + (" ..." if len(events) > 5 else "")
    rows.append((f"false flags, {args.hours:g} h without a leak", "0", detail))
    count, events, _, _ = false_flags(max(1, args.nodes // 8), args.hours, args.seed, restart=True)
    detail = f"{count} over {max(1, args.nodes // 8)} nodes"
    if events:
        detail += ": " + ", ".join(events[:5]) + (" ..." if len(events) > 5 else "")
    rows.append(
        (f"false flags, {args.hours:g} h, cycles restarted at each step", "- (stress)", detail)
    )

    per_cycle = cpu_per_cycle(args.nodes, 1_200, args.seed)
    rows.append(
        (
            "CPU per node per cycle (record_node, 3 groups)",
            "-",
            f"{per_cycle * 1e6:.1f} us; {cpu / node_cycles * 1e6:.1f} us recording five minutes per call",
        )
    )
    traced, arrays = memory_1000x8(args.seed)
    rows.append(
        (
            "memory, 1,000 nodes x 8 groups, 1 s, full window",
            "-",
            f"{traced / 2**20:.0f} MiB traced ({arrays / 2**20:.0f} MiB in sample and bucket arrays)",
        )
    )

    width = [max(len(r[k]) for r in rows) for k in range(3)]
    head = ("case", "target", "result")
    width = [max(w, len(h)) for w, h in zip(width, head)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(head, width)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in width) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, width)) + " |")
    print(f"\n{time.perf_counter() - began:.0f} s wall", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
