"""What an empty ``raylens.phase`` costs the driver, without Ray and with Ray connected.

An empty phase (``with raylens.phase("x"): pass``) in a driver with no worker groups
measures only the driver's own process; with Ray connected it also publishes the phase on
the cluster's board at entry and withdraws it at exit (one key-value write and one delete
on the GCS, each a synchronous round trip). This benchmark times many empty phases
back to back and prints the mean, median and 99th percentile per phase, for each setting
asked for:

- ``local``: no Ray imported (a driver before ``ray.init``, or raylens without Ray);
- ``ray``: a local single-node Ray started here (``ray.init(address="local", num_cpus=1)``: a new cluster, never an existing one), stopped at the end.

Run: ``.venv/bin/python benchmarks/bench_phase_cost.py [--phases 500] [--modes local,ray]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

_CHILD = r"""
import sys, time, json
mode, count = sys.argv[1], int(sys.argv[2])
if mode == "ray":
    import ray
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
import raylens
for _ in range(20):  # warm up: imports, the driver's procfs reader, the GCS connection
    with raylens.phase("warm"):
        pass
times = []
for _ in range(count):
    start = time.perf_counter()
    with raylens.phase("empty"):
        pass
    times.append(time.perf_counter() - start)
if mode == "ray":
    ray.shutdown()
print(json.dumps(times))
"""


def _run(mode: str, count: int) -> list[float]:
    import json

    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(count)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return [float(value) for value in json.loads(done.stdout.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=500)
    parser.add_argument("--modes", default="local,ray")
    args = parser.parse_args()
    print(f"{'mode':<8} {'phases':>7} {'mean ms':>9} {'median ms':>10} {'p99 ms':>8}")
    for mode in args.modes.split(","):
        started = time.perf_counter()
        times = sorted(_run(mode, args.phases))
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        print(
            f"{mode:<8} {len(times):>7} {statistics.fmean(times) * 1e3:>9.3f} "
            f"{statistics.median(times) * 1e3:>10.3f} {p99 * 1e3:>8.3f}"
            f"   ({time.perf_counter() - started:.0f} s with start-up)"
        )


if __name__ == "__main__":
    main()
