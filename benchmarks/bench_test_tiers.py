"""Wall time of each test tier, run the way tox runs it.

The unit tier (``-m "not slow and not soak"``, quick hypothesis profile) runs once per
interpreter, so its wall time is what every change pays four or five times over; its
target is 20 s on a 2-core machine. The slow tier (``-m "(slow or hypothesis) and not
soak"``, the ci hypothesis profile) and the soak runs (``-m soak``, a process of their own)
run once per CI run. Each run is a fresh ``pytest``
process started from this interpreter, timed from start to exit, so interpreter
start-up, plugin loading, collection and teardown all count. Its CPU time (user plus
system, the process and its children) is shown beside the wall time: on a machine
others share, the wall time moves with their load and the CPU time much less.

Run from the repository root with the interpreter whose environment has raylens and
its test extras installed (or with ``PYTHONPATH=src:fakes``):
``python benchmarks/bench_test_tiers.py [--tiers unit,slow,soak] [--repeat 3] [--workers 2]``.
``--workers N`` runs each tier under pytest-xdist with N workers, to compare.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNIT_TARGET_S = 20.0


@dataclass(frozen=True)
class Tier:
    name: str
    marker: str
    hypothesis_profile: str
    target_s: float | None


TIERS = {
    "unit": Tier("unit", "not slow and not soak", "quick", UNIT_TARGET_S),
    "slow": Tier("slow", "(slow or hypothesis) and not soak", "ci", None),
    "soak": Tier("soak", "soak", "ci", None),
}


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu_seconds: float
    returncode: int
    summary: str


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(tier: Tier, workers: int) -> Run:
    command = [sys.executable, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"]
    command += ["-m", tier.marker]
    if workers > 0:
        command += ["-n", str(workers)]
    env = {**os.environ, "HYPOTHESIS_PROFILE": tier.hypothesis_profile}
    cpu_before, started = _children_cpu(), time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds, cpu_seconds = time.perf_counter() - started, _children_cpu() - cpu_before
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else result.stderr.strip()[-200:]
    return Run(seconds, cpu_seconds, result.returncode, summary)


def _tiers(text: str) -> list[Tier]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TIERS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"--tiers takes a comma-separated list of {', '.join(TIERS)}; got {text!r}"
        )
    return [TIERS[name] for name in names]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--repeat takes a whole number of 1 or more; got {text!r}"
        )
    return value


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"--workers takes 0 (no xdist) or a number of workers; got {text!r}"
        )
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiers", type=_tiers, default=[TIERS["unit"]], help="any of unit, slow, soak"
    )
    parser.add_argument("--repeat", type=_positive, default=1, help="runs per tier")
    parser.add_argument(
        "--workers", type=_workers, default=0, help="pytest-xdist workers (0: none)"
    )
    args = parser.parse_args(argv)

    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}, xdist workers: {args.workers or 'none'}"
    )
    print(
        f"{'tier':<6} {'wall best s':>11} {'wall median s':>13} {'CPU median s':>12} "
        f"{'target s':>8}  result (target judged on the best wall time)"
    )
    failed = False
    for tier in args.tiers:
        runs = [_run(tier, args.workers) for _ in range(args.repeat)]
        failed = failed or any(run.returncode != 0 for run in runs)
        best = min(run.seconds for run in runs)
        median = statistics.median(run.seconds for run in runs)
        cpu = statistics.median(run.cpu_seconds for run in runs)
        target, verdict = "-", ""
        if tier.target_s is not None:
            target = f"{tier.target_s:.0f}"
            verdict = "within target; " if best <= tier.target_s else "OVER target; "
        print(
            f"{tier.name:<6} {best:>11.1f} {median:>13.1f} {cpu:>12.1f} {target:>8}  "
            f"{verdict}{runs[-1].summary}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
