"""Reading the cluster from the Prometheus that scrapes it, instead of from every node.

Every node's sampler publishes its figures through Ray's metrics, and a Prometheus that
scrapes Ray (through Ray's service-discovery file, KubeRay or a cloud collector) holds
them all: :class:`PrometheusSource` reads them back with a fixed number of instant
queries per cycle, whatever the number of nodes, and answers what a host-memory monitor
answers. Anything that speaks Prometheus' HTTP API (VictoriaMetrics, Mimir, Thanos)
serves.
"""

from __future__ import annotations

from raylens.telemetry.prometheus_source._client import Answer, Fetcher, fetch_answers
from raylens.telemetry.prometheus_source._queries import (
    DEFAULT_JOB,
    GROUP_KINDS,
    INSTANCE_LABEL,
    KIND_LABEL,
    NODE_KINDS,
    Query,
    check_job,
    query_text,
)
from raylens.telemetry.prometheus_source._response import QueryError, Vector, parse_vector
from raylens.telemetry.prometheus_source._settings import (
    CA_FILE_ENV,
    JOB_ENV,
    PASSWORD_ENV,
    SCRAPE_INTERVAL_ENV,
    TOKEN_ENV,
    URL_ENV,
    USER_ENV,
    PrometheusSettings,
    check_url,
)
from raylens.telemetry.prometheus_source._source import MAX_NODES, PrometheusSource

__all__ = [
    "CA_FILE_ENV",
    "DEFAULT_JOB",
    "GROUP_KINDS",
    "INSTANCE_LABEL",
    "JOB_ENV",
    "KIND_LABEL",
    "MAX_NODES",
    "NODE_KINDS",
    "PASSWORD_ENV",
    "SCRAPE_INTERVAL_ENV",
    "TOKEN_ENV",
    "URL_ENV",
    "USER_ENV",
    "Answer",
    "Fetcher",
    "PrometheusSettings",
    "PrometheusSource",
    "Query",
    "QueryError",
    "Vector",
    "check_job",
    "check_url",
    "fetch_answers",
    "parse_vector",
    "query_text",
]
