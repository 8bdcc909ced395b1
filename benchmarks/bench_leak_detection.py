"""Leak detection on traces the detector was not tuned on, beside two PromQL rules an SRE would write.

Traces come from :mod:`raylens.simulation.trace_families`: one node sampled every second,
three worker groups and the memory outside them, with the truth (which group leaks, from
when, how fast). The families are split: ``--side tune`` are the ones raylens' thresholds
were chosen on, ``--side test`` (the default) the ones it is only measured on.

Detectors, each on the same traces:

- **raylens**: :class:`raylens.telemetry.growth.MemoryHistory` with the documented defaults
  (or the ``--window`` given),
  fed a minute of samples at a time through ``record_node_many`` (the replay API) and read
  after each minute. A flag is a part (group or memory outside the groups) starting to grow.
- **raylens, phases marked**: the same, with each phase boundary of the trace (every
  training phase's start and end) marked through ``MemoryHistory.mark_phase`` as it passes,
  as a node's sampler marks them when the driver enters and leaves ``raylens.phase``.
- **predict_linear**: ``predict_linear(used[1h], 4h) > kill line`` held for 5m, on the node's
  used memory scraped every 10 s (it cannot name a group).
- **deriv**: ``deriv(min_over_time(used[5m])[30m:1m]) > 5 MiB/min`` held for 10m, on each
  group's and the outside memory's series scraped every 10 s.

Figures: recall (leak traces whose leaking series is flagged after the leak starts), precision
(flags on leak traces that name the leaking group after it starts, over every flag on those
traces), false flags per node-day on the traces without a leak, median latency per leak rate,
and for raylens the share of detections whose rate is within 25 % of the truth and the median
time-to-limit error, at the first flag and 10 minutes later. The truth for the time to limit
is (kill line - recurring peak) / true rate, the recurring peak being the highest used memory
of the last hour without the leak, plus what the leak has added.

Run: ``python benchmarks/bench_leak_detection.py [--side test|tune|both] [--seeds N]
[--window S]``; ``--window`` judges with another growth window (``RAYLENS_GROWTH_WINDOW``), and
every run ends with the least delay that window allows (a leak on flat memory).
``--slow-teeth`` runs only a sweep of memory that climbs for minutes and is freed, tooth after
tooth, without a leak (what the families leave out).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from raylens.simulation.trace_families import (
    GIB,
    MIB,
    TEST_FAMILIES,
    TUNE_FAMILIES,
    Family,
    Trace,
    make_trace,
    sawtooth,
)
from raylens.telemetry.growth import (
    DEFAULT_GROWTH_WINDOW_S,
    GrowthEstimator,
    GrowthSettings,
    MemoryHistory,
    check_growth_window,
    kill_line,
)

MIB_MIN = MIB / 60.0
CHUNK_S = 60
SCRAPE_S = 10
#: Leak rates measured, MiB/min; a slow family runs the first three only.
RATES = (2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)
SLOW_RATES = (2.0, 3.0, 5.0)
AFTER_FLAG_S = 600.0


@dataclass
class Outcome:
    """What one detector did on one trace."""

    flags: int = 0
    flags_right: int = 0
    first_right: float | None = None
    rate_at: dict[float, float | None] = field(default_factory=dict)
    ttl_at: dict[float, tuple[float | None, float]] = field(default_factory=dict)


# --- raylens ------------------------------------------------------------------------


def _ttl_truth(trace: Trace, upto: int, line: float) -> float:
    hour = trace.times >= trace.times[upto] - 3600
    hour[upto + 1 :] = False
    benign_peak = float(np.max((trace.used - trace.leak)[hour]))
    level = benign_peak + float(trace.leak[upto])
    return max(0.0, (line - level) / trace.leak_rate)


def run_raylens(
    trace: Trace, *, phases_marked: bool = False, settings: GrowthSettings | None = None
) -> Outcome:
    history = MemoryHistory(settings)
    line = kill_line(trace.total)
    assert line is not None
    outcome = Outcome()
    parts = [*trace.groups, None]
    seen_spells = dict.fromkeys(parts, 0)
    next_mark = 0
    edges = np.searchsorted(
        trace.times, np.arange(trace.times[0], trace.times[-1] + CHUNK_S, CHUNK_S)
    )
    for a, b in itertools.pairwise(edges):
        if b <= a:
            continue
        # The minute's samples, each phase boundary in it marked between the samples before
        # and after it, as the sampler hears of them from the driver's ``raylens.phase``.
        marks: list[tuple[int, float]] = []
        while phases_marked and next_mark < len(trace.phases):
            at = float(trace.phases[next_mark])
            if at > float(trace.times[b - 1]):
                break
            marks.append((a + int(np.searchsorted(trace.times[a:b], at)), at))
            next_mark += 1
        start = a
        ends: list[tuple[int, float | None]] = [*marks, (b, None)]
        for split, boundary in ends:
            if split > start:
                history.record_node_many(
                    "n",
                    trace.times[start:split],
                    trace.used[start:split],
                    {g: v[start:split] for g, v in trace.groups.items()},
                )
            if boundary is not None:
                history.mark_phase("n", boundary)
            start = split
        view = history.node("n")
        assert view is not None
        now = float(trace.times[b - 1])
        for name in parts:
            part = view.other if name is None else view.groups.get(name)
            if part is None or part.spells == seen_spells[name]:
                continue
            began = part.growing_since if part.growing else now
            seen_spells[name] = part.spells
            outcome.flags += 1
            right = name == trace.leak_group and began is not None and began >= trace.leak_start
            if right:
                outcome.flags_right += 1
                if outcome.first_right is None:
                    outcome.first_right = now
        if trace.leak_group is not None and outcome.first_right is not None:
            since = now - outcome.first_right
            for mark in (0.0, AFTER_FLAG_S):
                if mark not in outcome.rate_at and since >= mark:
                    part = view.groups[trace.leak_group]
                    outcome.rate_at[mark] = part.rate if part.growing else None
                    outcome.ttl_at[mark] = (
                        view.time_to_limit(line),
                        _ttl_truth(trace, b - 1, line),
                    )
    return outcome


# --- PromQL rules -------------------------------------------------------------------


def _scraped(trace: Trace, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The series as a 10 s scrape sees it: the last sample at or before each scrape."""
    grid = np.arange(trace.times[0], trace.times[-1], SCRAPE_S)
    at = np.searchsorted(trace.times, grid, side="right") - 1
    return grid, values[np.clip(at, 0, None)]


def _held(condition: np.ndarray, evaluations: int) -> np.ndarray:
    """Where ``condition`` has held for ``evaluations`` evaluations in a row (an alert's ``for``)."""
    run = np.zeros(len(condition), dtype=np.int64)
    count = 0
    for k, ok in enumerate(condition):
        count = count + 1 if ok else 0
        run[k] = count
    return run >= evaluations


def _alerts(firing: np.ndarray, times: np.ndarray) -> list[float]:
    starts = np.flatnonzero(firing & ~np.concatenate(([False], firing[:-1])))
    return [float(times[k]) for k in starts]


def _rolling_slope(t: np.ndarray, y: np.ndarray, points: int) -> np.ndarray:
    """Least-squares slope over the last ``points`` values, NaN before there are that many."""
    out = np.full(len(y), np.nan)
    if len(y) < points:
        return out
    kernel = np.ones(points)
    tt = t - t[0]
    st, sy = np.convolve(tt, kernel, "valid"), np.convolve(y, kernel, "valid")
    stt, sty = np.convolve(tt * tt, kernel, "valid"), np.convolve(tt * y, kernel, "valid")
    n = float(points)
    out[points - 1 :] = (n * sty - st * sy) / (n * stt - st * st)
    return out


def run_predict_linear(trace: Trace) -> Outcome:
    line = kill_line(trace.total)
    assert line is not None
    grid, used = _scraped(trace, trace.used)
    minute = np.arange(0, len(grid), 60 // SCRAPE_S)
    window = 3600 // SCRAPE_S
    slope = _rolling_slope(grid, used, window)[minute]
    fitted_now = np.array([used[max(0, k - window + 1) : k + 1].mean() for k in minute]) + slope * (
        window * SCRAPE_S / 2
    )
    predicted = fitted_now + slope * 4 * 3600
    firing = _held(np.nan_to_num(predicted) > line, 5)
    outcome = Outcome()
    for at in _alerts(firing, grid[minute]):
        outcome.flags += 1
        if trace.leak_group is not None and at >= trace.leak_start:
            outcome.flags_right += 1
            if outcome.first_right is None:
                outcome.first_right = at
    return outcome


def run_deriv(trace: Trace) -> Outcome:
    outcome = Outcome()
    series: dict[str | None, np.ndarray] = {name: v for name, v in trace.groups.items()}
    series[None] = trace.other
    for name, values in series.items():
        grid, scraped = _scraped(trace, values)
        per_min = 60 // SCRAPE_S
        lows = np.array(
            [
                scraped[max(0, k - 5 * per_min + 1) : k + 1].min()
                for k in range(0, len(scraped), per_min)
            ]
        )
        minutes = grid[::per_min]
        slope = _rolling_slope(minutes, lows, 30)
        firing = _held(np.nan_to_num(slope) > 5 * MIB_MIN, 10)
        for at in _alerts(firing, minutes):
            outcome.flags += 1
            if name == trace.leak_group and at >= trace.leak_start:
                outcome.flags_right += 1
                if outcome.first_right is None:
                    outcome.first_right = at
    return outcome


Detector = Callable[[Trace], Outcome]
RAYLENS = ("raylens", "raylens, phases marked")


def detectors(settings: GrowthSettings) -> dict[str, Detector]:
    """The detectors compared, raylens judging with ``settings``."""
    return {
        "raylens": functools.partial(run_raylens, settings=settings),
        "raylens, phases marked": functools.partial(
            run_raylens, phases_marked=True, settings=settings
        ),
        "predict_linear": run_predict_linear,
        "deriv": run_deriv,
    }


# --- the table ----------------------------------------------------------------------


def traces(
    families: Iterable[Family], seeds: int, benign_seeds: int
) -> Iterable[tuple[Family, Trace]]:
    for family in families:
        if family.leak is None:
            for seed in range(benign_seeds):
                yield family, make_trace(family, seed)
            continue
        rates = SLOW_RATES if family.leak == "slow" else RATES
        for rate in rates:
            for seed in range(seeds):
                yield family, make_trace(family, 1000 + seed, leak_rate_mib_min=rate)


def _rate_close(got: float | None, trace: Trace) -> bool:
    """Whether a reported rate is within 25 % of the trace's leak rate."""
    return got is not None and abs(got - trace.leak_rate) <= 0.25 * trace.leak_rate


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt_min(seconds: float | None) -> str:
    return "missed" if seconds is None else f"{seconds / 60:.0f} min"


def _median_latency(by_rate: dict[float, list[float | None]], rate: float) -> str:
    """The median delay at ``rate`` (a miss counts as the longest), "missed" when most were."""
    delays = by_rate.get(rate, [])
    if not delays:
        return "-"
    found = [d for d in delays if d is not None]
    if len(found) * 2 < len(delays):
        return "missed"
    return _fmt_min(_median(sorted(d if d is not None else math.inf for d in delays)))


def measure(
    families: tuple[Family, ...],
    seeds: int,
    benign_seeds: int,
    label: str,
    settings: GrowthSettings,
) -> None:
    compared = detectors(settings)
    benign_hours = 0.0
    totals: dict[str, dict[str, float]] = {d: defaultdict(float) for d in compared}
    latency: dict[str, dict[float, list[float | None]]] = {d: defaultdict(list) for d in compared}
    rate_ok: dict[str, dict[float, list[bool]]] = {d: {0.0: [], AFTER_FLAG_S: []} for d in RAYLENS}
    ttl_err: dict[str, dict[float, list[float]]] = {d: {0.0: [], AFTER_FLAG_S: []} for d in RAYLENS}
    ttl_present: dict[str, dict[float, list[bool]]] = {
        d: {0.0: [], AFTER_FLAG_S: []} for d in RAYLENS
    }
    false_where: dict[str, list[str]] = {d: [] for d in RAYLENS}
    cpu = 0.0
    started = time.perf_counter()
    for family, trace in traces(families, seeds, benign_seeds):
        leak = trace.leak_group is not None
        if not leak:
            benign_hours += trace.hours
        for name, detector in compared.items():
            began = time.thread_time()
            outcome = detector(trace)
            if name == "raylens":
                cpu += time.thread_time() - began
            tally = totals[name]
            if not leak:
                tally["false"] += outcome.flags
                if name in RAYLENS and outcome.flags:
                    false_where[name].append(f"{family.name}/{trace.seed}: {outcome.flags}")
                continue
            nominal = trace.leak_rate / MIB_MIN
            tally["leaks"] += 1
            tally["found"] += outcome.first_right is not None
            tally["flags"] += outcome.flags
            tally["right"] += outcome.flags_right
            delay = None if outcome.first_right is None else outcome.first_right - trace.leak_start
            latency[name][round(nominal)].append(delay)
            if name in RAYLENS and outcome.first_right is not None and nominal >= 5:
                for mark in (0.0, AFTER_FLAG_S):
                    if mark not in outcome.rate_at:
                        continue
                    rate_ok[name][mark].append(_rate_close(outcome.rate_at[mark], trace))
                    estimate, truth = outcome.ttl_at[mark]
                    ttl_present[name][mark].append(estimate is not None)
                    if estimate is not None and truth > 0:
                        ttl_err[name][mark].append(abs(estimate - truth) / truth)
    days = benign_hours / 24.0
    print(
        f"\n## {label}: {benign_hours:.0f} node-hours without a leak, "
        f"{int(totals['raylens']['leaks'])} leak traces ({time.perf_counter() - started:.0f} s)\n"
    )
    print(
        "| detector | recall (>= 5 MiB/min) | recall (all) | precision | false flags / node-day | "
        "latency 50 MiB/min | latency 5 MiB/min |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in compared:
        tally = totals[name]
        by_rate = latency[name]
        big = [d for r, ds in by_rate.items() if r >= 5 for d in ds]
        recall_big = sum(d is not None for d in big) / len(big) if big else math.nan
        recall = tally["found"] / tally["leaks"] if tally["leaks"] else math.nan
        precision = tally["right"] / tally["flags"] if tally["flags"] else math.nan
        if name == "predict_linear":
            precision_text = "- (node only)"
        else:
            precision_text = "-" if math.isnan(precision) else f"{precision:.2f}"

        print(
            f"| {name} | {recall_big:.2f} | {recall:.2f} | {precision_text} | "
            f"{tally['false'] / days if days else math.nan:.1f} | {_median_latency(by_rate, 50)} | {_median_latency(by_rate, 5)} |"
        )
    for variant in RAYLENS:
        print(f"\n{variant}, detections of leaks >= 5 MiB/min:\n")
        print("| when | rate within 25 % | time to limit present | time-to-limit error (median) |")
        print("|---|---:|---:|---:|")
        for mark, text in ((0.0, "first flag"), (AFTER_FLAG_S, "10 min later")):
            ok, present = rate_ok[variant][mark], ttl_present[variant][mark]
            share = sum(ok) / len(ok) if ok else math.nan
            shown = sum(present) / len(present) if present else math.nan
            error = _median(ttl_err[variant][mark])
            print(
                f"| {text} | {share:.2f} ({len(ok)}) | {shown:.2f} | "
                f"{'-' if error is None else f'{error * 100:.0f} %'} |"
            )
    rates = sorted(latency["raylens"])
    print("\nraylens latency by leak rate (median, found/trials):\n")
    print("| MiB/min | " + " | ".join(str(int(r)) for r in rates) + " |")
    print("|---|" + "---:|" * len(rates))
    for variant in RAYLENS:
        cells = []
        for rate in rates:
            ds = latency[variant][rate]
            found = [d for d in ds if d is not None]
            cells.append(
                f"{_fmt_min(_median(found)) if found else 'missed'} ({len(found)}/{len(ds)})"
            )
        print(f"| {variant} | " + " | ".join(cells) + " |")
    for variant in RAYLENS:
        if false_where[variant]:
            print(f"\n{variant} false flags: " + ", ".join(false_where[variant]))
    print(f"\nraylens CPU: {cpu:.1f} s for all traces ({benign_hours:.0f}+ node-hours at 1 s)")


def _teeth(
    t: np.ndarray, seed: int, heights: tuple[float, float], periods: tuple[float, float]
) -> np.ndarray:
    """An 8 GiB series with teeth climbing ``heights`` bytes (drawn for each tooth) over
    ``periods`` seconds, 8 MiB of jitter."""
    rng = np.random.default_rng(seed)
    values = 8 * GIB + sawtooth(t, rng, *heights, periods)
    return values + rng.normal(0.0, 8 * MIB, len(t))


def _minutes(
    t: np.ndarray, values: np.ndarray, settings: GrowthSettings
) -> Iterable[tuple[float, GrowthEstimator]]:
    """The estimator judging with ``settings`` after each minute of ``values``, and the
    minute's last time."""
    estimator = GrowthEstimator(settings)
    for start in range(0, len(t), CHUNK_S):
        estimator.add_many(t[start : start + CHUNK_S], values[start : start + CHUNK_S])
        yield float(t[min(start + CHUNK_S, len(t)) - 1]), estimator


def _first_flag(
    t: np.ndarray, values: np.ndarray, start: float, settings: GrowthSettings
) -> float | None:
    """Seconds from ``start`` to the first minute the series is growing in a spell begun at or
    after ``start``, or None."""
    for now, estimator in _minutes(t, values, settings):
        if estimator.growing_since is not None and estimator.growing_since >= start:
            return now - start
    return None


def clean_ramp(settings: GrowthSettings) -> None:
    """How soon a leak is flagged on flat memory with 2 MiB of jitter and nothing else: the
    least delay the window allows, which no family's leak can beat."""
    start = 7200.0
    t = np.arange(0.0, start + 3 * 3600.0)
    flat = 16 * GIB + np.random.default_rng(0).normal(0.0, 2 * MIB, len(t))
    cells = []
    for rate in (5.0, 20.0, 50.0, 200.0):
        delay = _first_flag(
            t, flat + np.clip(t - start, 0.0, None) * rate * MIB_MIN, start, settings
        )
        cells.append(f"{rate:g}: {_fmt_min(delay)}")
    print(
        f"\nA leak on flat memory (2 MiB of jitter), {settings.window_s:g} s window, flagged after"
        " (MiB/min): " + ", ".join(cells)
    )


def slow_teeth(seeds: int, settings: GrowthSettings) -> None:
    """Spells, and the share of minutes flagged growing, on memory that climbs for minutes and
    is freed, tooth after tooth, with no leak: memory the families leave out (their teeth last
    at most 5 minutes)."""
    print(
        "\n## slow teeth, no leak: spells per 8 h on one series and the share of minutes flagged"
        " growing (8 GiB base, 8 MiB jitter)\n"
    )
    print("| teeth last | 1 GiB | 4 GiB | 0.2-2 GiB, tooth by tooth |")
    print("|---|---:|---:|---:|")
    t = np.arange(0.0, 8 * 3600.0)
    heights = ((1 * GIB, 1 * GIB), (4 * GIB, 4 * GIB), (0.2 * GIB, 2 * GIB))
    for periods in (
        (30.0, 300.0),
        (180.0, 600.0),
        (300.0, 900.0),
        (540.0, 660.0),
        (1800.0, 2700.0),
    ):
        cells = []
        for height in heights:
            spells, shares = [], []
            for seed in range(seeds):
                minutes_growing, spells_seen = 0, 0
                for _, estimator in _minutes(t, _teeth(t, seed, height, periods), settings):
                    minutes_growing += estimator.growing
                    spells_seen = estimator.spells
                spells.append(spells_seen)
                shares.append(minutes_growing * CHUNK_S / len(t))
            cells.append(f"{statistics.mean(spells):.1f} ({statistics.mean(shares):.0%})")
        print(f"| {periods[0]:.0f}-{periods[1]:.0f} s | " + " | ".join(cells) + " |")
    print(
        "\nA leak from the first hour under 1 GiB teeth of 540-660 s: median minutes to the flag\n"
    )
    print("| MiB/min | 5 | 20 | 50 | 200 |")
    print("|---|---:|---:|---:|---:|")
    cells = []
    for rate in (5.0, 20.0, 50.0, 200.0):
        delays = []
        for seed in range(seeds):
            leak = np.clip(t - 3600.0, 0.0, None) * rate * MIB_MIN
            teeth = _teeth(t, seed, (1 * GIB, 1 * GIB), (540.0, 660.0))
            delay = _first_flag(t, teeth + leak, 3600.0, settings)
            if delay is not None:
                delays.append(delay)
        cells.append(_median_latency({rate: delays + [None] * (seeds - len(delays))}, rate))
    print("| raylens | " + " | ".join(cells) + " |")


def tune_workload_leaks(seeds: int, settings: GrowthSettings) -> None:
    """Leaks that start mid-run or run only while training, under every tune-side workload
    (the tune families carry only three of these pairings): how soon each is found and how
    close its rate is ten minutes after the flag. Tune side only: the test workloads keep
    their own leaks."""
    print(
        "\n## leaks under every tune workload: found, median minutes to the flag, rate within"
        " 25 % ten minutes on (5, 20, 50 and 200 MiB/min)\n"
    )
    print("| workload | leak | found | latency (median) | rate within 25 % |")
    print("|---|---|---:|---:|---:|")
    totals = [0, 0]
    for workload in (f for f in TUNE_FAMILIES if f.leak is None):
        for kind in ("mid_run", "training"):
            family = Family(f"x_{workload.name}_{kind}", workload.workload, 4.0, leak=kind)
            found, delays, close, rated = 0, [], 0, 0
            for rate in (5.0, 20.0, 50.0, 200.0):
                for seed in range(seeds):
                    trace = make_trace(family, 2000 + seed, leak_rate_mib_min=rate)
                    outcome = run_raylens(trace, settings=settings)
                    if outcome.first_right is None:
                        continue
                    found += 1
                    delays.append(outcome.first_right - trace.leak_start)
                    if AFTER_FLAG_S in outcome.rate_at:
                        rated += 1
                        close += _rate_close(outcome.rate_at[AFTER_FLAG_S], trace)
            totals[0] += close
            totals[1] += rated
            print(
                f"| {workload.name} | {kind} | {found}/{4 * seeds} | {_fmt_min(_median(delays))}"
                f" | {close}/{rated} |"
            )
    print(f"\nrate within 25 % ten minutes after the flag: {totals[0]} of {totals[1]} detections")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("test", "tune", "both"), default="test")
    parser.add_argument("--seeds", type=int, default=4, help="traces per leak family and rate")
    parser.add_argument(
        "--benign-seeds", type=int, default=13, help="traces per family without a leak (8 h each)"
    )
    parser.add_argument(
        "--slow-teeth", action="store_true", help="only the sweep of slow teeth without a leak"
    )
    parser.add_argument(
        "--tune-workload-leaks",
        action="store_true",
        help="only leaks mid-run and while training under every tune workload (3 seeds each)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_GROWTH_WINDOW_S,
        help="raylens' growth window in seconds, as RAYLENS_GROWTH_WINDOW sets it (default"
        f" {DEFAULT_GROWTH_WINDOW_S:g}): what a shorter or a longer one gives and costs",
    )
    args = parser.parse_args(argv)
    try:
        window = check_growth_window(args.window, name="--window")
    except ValueError as error:
        parser.error(str(error))
    settings = GrowthSettings.from_env({}, window_s=window)
    note = "" if window == DEFAULT_GROWTH_WINDOW_S else f", {window:g} s window"
    if note and (args.tune_workload_leaks or args.slow_teeth):
        print(f"\nraylens judging with a {window:g} s growth window")
    if args.tune_workload_leaks:
        tune_workload_leaks(3, settings)
        return 0
    if args.slow_teeth:
        slow_teeth(args.seeds, settings)
        return 0
    for side, families, label in (
        ("tune", TUNE_FAMILIES, "tune families"),
        ("test", TEST_FAMILIES, "test families (never tuned on)"),
    ):
        if args.side in (side, "both"):
            measure(families, args.seeds, args.benign_seeds, label + note, settings)
    clean_ramp(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
