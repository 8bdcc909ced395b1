"""Soak: distinct attribute sets churned through one observable gauge, lens against the bare SDK.

Each collection reports ``--live`` attribute sets (``host.name``, ``rl.worker_groups``,
``ray.node.id``) and replaces ``--churn`` of them by sets never seen before, until
``--distinct`` sets have been reported in all. That is what a long run on an
autoscaling cluster does to the host-memory gauges: nodes come and go, worker
groups relabel them, served processes restart under new pids.

Two pipelines are measured, each in a child process of its own so that their RSS
figures do not mix:

- ``lens``: the gauge registered with :func:`raylens.lens.register_observable_gauge`
  and read through lens' pipeline, which releases the attribute sets no
  collection has reported for ``IDLE_COLLECTIONS`` collections;
- ``sdk``: the same gauge on a bare ``MeterProvider`` with lens' cardinality limit
  (the SDK keeps every set it has ever seen).

At each checkpoint the table shows the points the collection exported, how many of
them were ``otel.metric.overflow`` points, how many live series were missing, the
median collection time since the last checkpoint (wall, and CPU time of the
process, which a loaded machine disturbs less), the aggregations the SDK holds and
the RSS growth since the first collection.

Run: ``.venv/bin/python benchmarks/bench_soak.py [--distinct 250000] [--live 1000]
[--churn 1000] [--checkpoints 6] [--only lens|sdk]``
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import psutil
from opentelemetry.metrics import CallbackOptions, Observation


@dataclass
class Row:
    distinct: int
    points: int
    overflow: int
    missing: int
    collection_ms: float
    collection_cpu_ms: float
    held: int
    rss_growth_mib: float


class _Churn:
    """The live window: ids ``start .. start + live - 1``, moved by ``churn`` per collection."""

    def __init__(self, live: int, churn: int) -> None:
        self.live = live
        self.churn = churn
        self.start = 0

    @property
    def seen(self) -> int:
        return self.start + self.live

    def observe(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(
                1e9 + i,
                {
                    "host.name": f"host-{i}",
                    "rl.worker_groups": f"group-{i % 17}",
                    "ray.node.id": f"{i:056x}",
                },
            )
            for i in range(self.start, self.start + self.live)
        ]

    def advance(self) -> None:
        self.start += self.churn


def _pipeline(mode: str, churn: _Churn) -> tuple[Callable[[], object], Callable[[], int]]:
    """``(collect, held)`` for ``mode``: collect returns MetricsData; held counts SDK aggregations."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import View

    from raylens.lens import (
        CARDINALITY_LIMIT,
        OBSERVABLE_GAUGE,
        RecordedMetric,
        TelemetryConfig,
        _sdk_state,
        get_telemetry_handle,
        init_telemetry,
        register_observable_gauge,
    )

    reader = InMemoryMetricReader()
    if mode == "lens":
        gauge = RecordedMetric("soak.memory", OBSERVABLE_GAUGE, "By", "churning gauge")
        register_observable_gauge(gauge, churn.observe)
        init_telemetry(TelemetryConfig(), metric_reader=reader)
        handle = get_telemetry_handle()
        assert handle is not None
        return reader.get_metrics_data, lambda: handle.held_attribute_sets(gauge.name)
    provider = MeterProvider(
        metric_readers=[reader],
        views=[View(instrument_name="*", aggregation_cardinality_limit=CARDINALITY_LIMIT)],
        shutdown_on_exit=False,
    )
    instrument = provider.get_meter("soak").create_observable_gauge(
        "soak.memory", callbacks=[churn.observe], unit="By"
    )
    return reader.get_metrics_data, lambda: _sdk_state.held_attribute_sets(instrument)


def _run(
    mode: str, distinct: int, live: int, churn_per: int, checkpoints: int, out: Connection
) -> None:
    churn = _Churn(live, churn_per)
    collect, held = _pipeline(mode, churn)
    process = psutil.Process()
    marks = sorted(
        {
            live,
            *(
                live + round(k * (distinct - live) / (checkpoints - 1))
                for k in range(1, checkpoints)
            ),
        }
    )
    times: list[float] = []
    cpu_times: list[float] = []
    rss_start = None
    while churn.seen <= distinct:
        started, cpu_started = time.perf_counter(), time.process_time()
        data = collect()
        times.append((time.perf_counter() - started) * 1000)
        cpu_times.append((time.process_time() - cpu_started) * 1000)
        if rss_start is None:
            gc.collect()
            rss_start = process.memory_info().rss
        if churn.seen >= marks[0]:
            points = [
                p
                for rm in data.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
                for p in m.data.data_points
            ]
            overflow = sum(1 for p in points if "otel.metric.overflow" in p.attributes)
            exported = {p.attributes.get("ray.node.id") for p in points}
            missing = sum(
                1 for i in range(churn.start, churn.start + live) if f"{i:056x}" not in exported
            )
            gc.collect()
            out.send(
                Row(
                    distinct=churn.seen,
                    points=len(points),
                    overflow=overflow,
                    missing=missing,
                    collection_ms=statistics.median(times),
                    collection_cpu_ms=statistics.median(cpu_times),
                    held=held(),
                    rss_growth_mib=(process.memory_info().rss - rss_start) / 2**20,
                )
            )
            times, cpu_times = [], []
            marks.pop(0)
            if not marks:
                break
        churn.advance()
    out.send(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distinct", type=int, default=250_000)
    parser.add_argument("--live", type=int, default=1_000)
    parser.add_argument("--churn", type=int, default=1_000)
    parser.add_argument("--checkpoints", type=int, default=6)
    parser.add_argument("--only", choices=("lens", "sdk"))
    args = parser.parse_args(argv)
    if not 0 < args.live <= args.distinct or args.churn < 1 or args.checkpoints < 2:
        parser.error("need 0 < --live <= --distinct, --churn >= 1 and --checkpoints >= 2")

    from opentelemetry.sdk.version import __version__ as sdk_version

    print(
        f"# Python {platform.python_version()}, opentelemetry-sdk {sdk_version}; "
        f"{args.live:,} live sets, {args.churn:,} new per collection, {args.distinct:,} in all"
    )
    print(
        "| pipeline | distinct sets seen | points exported | overflow points | live missing "
        "| collection ms (median) | collection CPU ms (median) | SDK-held sets | RSS growth MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    context = multiprocessing.get_context("spawn")
    for mode in ("lens", "sdk"):
        if args.only and mode != args.only:
            continue
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=_run, args=(mode, args.distinct, args.live, args.churn, args.checkpoints, send)
        )
        child.start()
        send.close()
        while (row := receive.recv()) is not None:
            print(
                f"| {mode} | {row.distinct:,} | {row.points:,} | {row.overflow:,} | {row.missing:,} "
                f"| {row.collection_ms:.1f} | {row.collection_cpu_ms:.1f} | {row.held:,} "
                f"| {row.rss_growth_mib:+.1f} |",
                flush=True,
            )
        child.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
