"""``raylens watch --prometheus URL``: the same table, read from the Prometheus that scrapes Ray.

The figures come from a :class:`~raylens.telemetry.prometheus_source.PrometheusSource`
(a fixed number of queries per cycle, whatever the number of nodes); nothing is
scraped from the nodes. With ``--address`` too, the watch also connects to the
cluster, to name each node by its Ray node id and host and to show the phase each
job is in; without it, a node is named by the address Prometheus scrapes.
"""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING, cast

from raylens.cli.cluster_views import import_ray, run_watch, watch_nodes
from raylens.cli.gcs_probe import check_reachable
from raylens.cli.output import Output
from raylens.cli.parser import CliError
from raylens.cli.pipeline import start_telemetry
from raylens.cluster import ray_call_errors
from raylens.demo import keep_sigterm_handler
from raylens.safe_text import printable

if TYPE_CHECKING:
    from raylens.cluster import ClusterView
    from raylens.telemetry.host_memory import HostMemoryMonitor
    from raylens.telemetry.prometheus_source import Fetcher

__all__ = ["run_prometheus_watch", "run_watch_command"]


def run_watch_command(args: argparse.Namespace, stop: threading.Event) -> int:
    """``raylens watch``: from Prometheus with ``--prometheus``, else from the nodes."""
    if getattr(args, "prometheus", None) is None:
        return run_watch(args, stop)
    return run_prometheus_watch(args, stop)


def run_prometheus_watch(
    args: argparse.Namespace, stop: threading.Event, *, fetch: Fetcher | None = None
) -> int:
    """Watch the cluster through the Prometheus at ``--prometheus`` (or its variable).

    ``fetch`` sends each cycle's queries (default: over HTTP).
    """
    from raylens.telemetry.prometheus_source import (
        PrometheusSettings,
        PrometheusSource,
        fetch_answers,
    )

    try:
        settings = PrometheusSettings.from_env(url=args.prometheus or None)
    except ValueError as error:
        raise CliError(str(error)) from None
    cluster: ClusterView | None = None
    ray = None
    if args.address is not None:
        ray = import_ray()
        from raylens.cluster import RayClusterView

        check_reachable(args.address)
        try:
            with keep_sigterm_handler():
                ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
        except ray_call_errors(ray) as error:  # ConnectionError, RuntimeError, ValueError, RayError
            said = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            raise CliError(f"cannot reach a Ray cluster at {args.address!r}: {said}") from None
        cluster = RayClusterView()
    try:
        source = PrometheusSource(
            settings, interval=args.interval, cluster=cluster, fetch=fetch or fetch_answers
        )
        source.collect_once()
        cycle = source.last_cycle
        if cycle is not None and cycle.evaluated_at is None and cycle.errors:
            first = next(iter(cycle.errors.values()))
            raise CliError(
                f"cannot read Prometheus at {printable(settings.url)}: {printable(first)[:200]}"
            )
        start_telemetry(args.exporter, as_json=args.json)
        output = Output(as_json=args.json)
        try:
            watch_nodes(
                cast("HostMemoryMonitor", source),
                args,
                output=output,
                title=f"Ray host memory from Prometheus at {printable(settings.url)}",
                stop=stop,
                cluster=cluster,
            )
        finally:
            source.stop()
        return output.exit_status()
    finally:
        if ray is not None:
            ray.shutdown()
