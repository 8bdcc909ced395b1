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

A second table reads per-group series: the head payload with 64 lines of a worker-group gauge
appended, in the shape a Ray 2.60 metrics agent serves a user gauge (``ray_`` prefix, Ray's
Component/NodeAddress/SessionName/Version/WorkerId and ``otel_scope_*`` labels, the gauge's own
tags, values escaped). It times, in turn, ``extract_samples`` (last value only) and
``extract_labelled_samples`` (every sample with its labels) for that one name, and the
prometheus_client parse, after checking the labelled result against it.

Run: ``.venv/bin/python benchmarks/bench_parse.py [--repeat 7]``
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import timeit
from collections.abc import Callable, Sequence

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from raylens.telemetry.prometheus_text import (
    LabelledSample,
    extract_labelled_samples,
    extract_samples,
)
from raylens_fakes.raylet import RECORDED_PAYLOADS, load_recorded_payload

WANTED = ("ray_node_mem_used", "ray_node_mem_total")
GROUP = "ray_raylens_worker_group_memory_bytes"
GROUP_LINES = 64


def full_parse(payload: bytes, parser: Callable) -> dict[str, float]:
    """What a scraper built on prometheus_client does: parse everything, keep two series."""
    found: dict[str, float] = {}
    for family in parser(payload.decode("utf-8")):
        for sample in family.samples:
            if sample.name in WANTED:
                found[sample.name] = float(sample.value)
    return found


def group_lines(count: int) -> bytes:
    """``count`` worker-group gauge lines as a Ray 2.60 metrics agent writes them."""
    groups = ("policy", "rollout", "reference", "critic", "reward", "actor", "learner", "env")
    lines = [
        f"# HELP {GROUP} Host memory of one worker group's processes on this node.",
        f"# TYPE {GROUP} gauge",
    ]
    for index in range(count):
        labels = (
            'Component="core_worker",NodeAddress="192.0.2.2",'
            'SessionName="session_2026-11-29_15-07-04_874414_13768",Version="2.60.0",'
            f'WorkerId="{index:056x}",memory_type="rss",'
            'otel_scope_name="ray._private.telemetry.open_telemetry_metric_recorder",'
            'otel_scope_schema_url="",otel_scope_version="",'
            f'rl_worker_group="{groups[index % len(groups)]}"'
        )
        lines.append(f"{GROUP}{{{labels}}} {1.0e9 + index * 1.5e6:.6e}")
    return ("\n".join(lines) + "\n").encode()


def full_parse_labelled(payload: bytes) -> list[LabelledSample]:
    """Every group sample with its labels, read by prometheus_client's full parse."""
    return [
        LabelledSample(sample.name, tuple(sorted(sample.labels.items())), float(sample.value))
        for family in text_families(payload.decode("utf-8"))
        for sample in family.samples
        if sample.name == GROUP
    ]


def paired_per_call_seconds(
    funcs: Sequence[Callable[[], object]], repeat: int
) -> list[list[float]]:
    """One call's time for each function, over ``repeat`` rounds taken in turn."""
    timers = [timeit.Timer(func) for func in funcs]
    numbers = [max(1, timer.autorange()[0]) for timer in timers]
    times: list[list[float]] = [[] for _ in timers]
    for _ in range(repeat):
        for timer, number, out in zip(timers, numbers, times):
            out.append(timer.timeit(number) / number)
    return times


def labelled_table(repeat: int) -> int:
    """Print the per-group table; 1 when the labelled samples differ from prometheus_client's."""
    payload = load_recorded_payload("head.prom") + group_lines(GROUP_LINES)
    labelled = extract_labelled_samples(payload, [GROUP])
    if labelled != full_parse_labelled(payload) or len(labelled) != GROUP_LINES:
        print("labelled samples differ from prometheus_client's", file=sys.stderr)
        return 1
    last, every, full = paired_per_call_seconds(
        [
            lambda: extract_samples(payload, [GROUP]),
            lambda: extract_labelled_samples(payload, [GROUP]),
            lambda: full_parse_labelled(payload),
        ],
        repeat,
    )
    header = (
        f"{'payload':<26} {'size KB':>8} {'extract_samples µs':>19} "
        f"{'labelled µs':>14} {'prometheus_client ms':>21}"
    )
    print()
    print(header)
    print("-" * len(header))
    print(
        f"{f'head.prom + {GROUP_LINES} groups':<26} {len(payload) / 1024:>8.1f} "
        f"{f'{statistics.median(last) * 1e6:.1f} ({min(last) * 1e6:.1f})':>19} "
        f"{f'{statistics.median(every) * 1e6:.1f} ({min(every) * 1e6:.1f})':>14} "
        f"{f'{statistics.median(full) * 1e3:.2f} ({min(full) * 1e3:.2f})':>21}"
    )
    return 0


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
            [
                functools.partial(extract_samples, payload, WANTED),
                functools.partial(full_parse, payload, full_parser),
            ],
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
    return labelled_table(args.repeat)


if __name__ == "__main__":
    raise SystemExit(main())
