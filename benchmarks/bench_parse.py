"""Reading host memory out of one raylet payload: raylens against a full prometheus_client parse.

For each recorded Ray 2.60 payload bundled in ``raylens/simulation/payloads/``, times
two ways of getting ``ray_node_mem_used`` and ``ray_node_mem_total`` from the raw response bytes:

- raylens: :func:`raylens.telemetry.prometheus_text.extract_samples`, which searches for the
  wanted lines and parses only those (the cached extractor lookup is included);
- prometheus_client: decode the bytes, parse the whole payload with
  ``prometheus_client.parser.text_string_to_metric_families`` (the OpenMetrics parser for
  ``*.openmetrics``) and pick the two series out, as a straightforward scraper would.

Both run in the same process after checking that they agree. Each figure is the median (and
best) over ``--repeat`` rounds of one call's time, each round averaging over as many calls as
fill about 0.2 s. The two take turns, one round each, so that other work on the machine slows
both alike; ``ratio`` is the median over rounds of prometheus_client's time over raylens'.

Run: ``.venv/bin/python benchmarks/bench_parse.py [--repeat 7]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from collections.abc import Callable

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from raylens.telemetry.prometheus_text import extract_samples
from raylens_fakes.raylet import RECORDED_PAYLOADS, load_recorded_payload

WANTED = ("ray_node_mem_used", "ray_node_mem_total")


def full_parse(payload: bytes, parser: Callable) -> dict[str, float]:
    """What a scraper built on prometheus_client does: parse everything, keep two series."""
    found: dict[str, float] = {}
    for family in parser(payload.decode("utf-8")):
        for sample in family.samples:
            if sample.name in WANTED:
                found[sample.name] = float(sample.value)
    return found


def paired_per_call_seconds(
    first: Callable[[], object], second: Callable[[], object], repeat: int
) -> tuple[list[float], list[float]]:
    """One call's time for each of two functions, over ``repeat`` rounds taken in turn."""
    timers = (timeit.Timer(first), timeit.Timer(second))
    numbers = [max(1, timer.autorange()[0]) for timer in timers]
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for timer, number, out in zip(timers, numbers, times):
            out.append(timer.timeit(number) / number)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timing rounds per figure")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")

    print(f"Python {sys.version.split()[0]}; median (best) of {args.repeat} rounds")
    header = (
        f"{'payload':<18} {'size KB':>8} {'raylens µs':>18} {'prometheus_client ms':>22} "
        f"{'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for name in RECORDED_PAYLOADS:
        payload = load_recorded_payload(name)
        full_parser = openmetrics_families if name.endswith(".openmetrics") else text_families
        fast = extract_samples(payload, WANTED)
        slow = full_parse(payload, full_parser)
        if fast != slow:
            print(f"{name}: results differ: raylens {fast} vs {slow}", file=sys.stderr)
            return 1

        ours, theirs = paired_per_call_seconds(
            lambda p=payload: extract_samples(p, WANTED),
            lambda p=payload, f=full_parser: full_parse(p, f),
            args.repeat,
        )
        ours_med, theirs_med = statistics.median(ours), statistics.median(theirs)
        ratio = statistics.median(slow / fast for fast, slow in zip(ours, theirs))
        print(
            f"{name:<18} {len(payload) / 1024:>8.1f} "
            f"{f'{ours_med * 1e6:.1f} ({min(ours) * 1e6:.1f})':>18} "
            f"{f'{theirs_med * 1e3:.2f} ({min(theirs) * 1e3:.2f})':>22} "
            f"{ratio:>6.0f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
