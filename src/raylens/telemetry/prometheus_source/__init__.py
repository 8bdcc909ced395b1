"""Reading the cluster from the Prometheus that scrapes it, instead of from every node.

Every node's sampler publishes its figures through Ray's metrics, and a Prometheus that
scrapes Ray (through Ray's service-discovery file, KubeRay or a cloud collector) holds
them all: :class:`PrometheusSource` reads them back with a fixed number of instant
queries per cycle, whatever the number of nodes, and answers what a host-memory monitor
answers. Anything that speaks Prometheus' HTTP API (VictoriaMetrics, Mimir, Thanos)
serves. Its settings' environment variable names, the query labels and the answer
parser are importable from the module that defines them.
"""

from __future__ import annotations

from raylens.telemetry.prometheus_source._client import Answer, Fetcher, fetch_answers
from raylens.telemetry.prometheus_source._queries import GROUP_KINDS, NODE_KINDS, Query, query_text
from raylens.telemetry.prometheus_source._settings import PrometheusSettings
from raylens.telemetry.prometheus_source._source import PrometheusSource

__all__ = [
    "GROUP_KINDS",
    "NODE_KINDS",
    "Answer",
    "Fetcher",
    "PrometheusSettings",
    "PrometheusSource",
    "Query",
    "fetch_answers",
    "query_text",
]
