"""The Prometheus source over real sockets: a fake Prometheus API on 127.0.0.1 (slow tier)."""

from __future__ import annotations

import base64
import time

import pytest

from raylens.telemetry.prometheus_source import (
    PrometheusSettings,
    PrometheusSource,
    Query,
    fetch_answers,
)
from raylens_fakes.prometheus_api import FakePrometheus, FakeTarget

pytestmark = pytest.mark.slow

GIB = 1024**3


def _fake() -> FakePrometheus:
    now = time.time()
    fake = FakePrometheus(now=now)
    fake.targets["10.0.0.1:8080"] = FakeTarget(
        ip="10.0.0.1",
        scraped_at=now,
        sampled_at=now,
        groups={"policy": (2 * GIB, None, 3.0, 256.0)},
        node=(4 * GIB, 256.0, 0.0, 1.0, 60 * GIB, 7200.0, 600.0),
    )
    return fake


def test_every_query_is_answered_over_http_and_read_back() -> None:
    fake = _fake()
    with fake.running() as url:
        source = PrometheusSource(PrometheusSettings(url), interval=1.0)
        source.collect_once()
    (sample,) = source.latest()
    assert sample.error is None and sample.used == 8 * GIB
    assert source.query_errors() == []
    assert len(fake.calls) == len(Query)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RAYLENS_PROMETHEUS_TOKEN": "s3cret"}, "Bearer s3cret"),
        (
            {"RAYLENS_PROMETHEUS_USER": "ann", "RAYLENS_PROMETHEUS_PASSWORD": "pw"},
            "Basic " + base64.b64encode(b"ann:pw").decode(),
        ),
        ({}, ""),
    ],
)
def test_credentials_come_from_the_environment(env: dict[str, str], expected: str) -> None:
    fake = _fake()
    with fake.running() as url:
        settings = PrometheusSettings.from_env(url=url, environ=env)
        fetch_answers(settings, (Query.DOWN,))
    assert fake.authorizations == [expected]


def test_a_trickled_answer_ends_at_the_deadline_and_costs_only_its_query() -> None:
    fake = _fake()
    fake.trickle_s = 0.05
    with fake.running() as url:
        settings = PrometheusSettings(url, timeout_s=0.5)
        started = time.monotonic()
        answers = fetch_answers(settings, (Query.DOWN, Query.NODE_USED))
        took = time.monotonic() - started
    assert took < 5.0
    assert all(
        answer.body is None and "within 0.5 s" in str(answer.error) for answer in answers.values()
    )


def test_an_answer_over_the_cap_is_refused() -> None:
    fake = _fake()
    with fake.running() as url:
        settings = PrometheusSettings(url, max_body_bytes=64)
        answers = fetch_answers(settings, (Query.NODE_USED,))
    assert answers[Query.NODE_USED].body is None
    assert "larger than 64 bytes" in str(answers[Query.NODE_USED].error)


def test_the_driver_reads_from_prometheus_and_exports_growth_not_node_memory(
    raylens_state: object,
) -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from raylens.driver import init_telemetry_driver
    from raylens.lens import shutdown_telemetry

    fake = _fake()
    reader = InMemoryMetricReader()
    with fake.running() as url:
        init_telemetry_driver(
            metric_reader=reader,
            host_memory_interval=0.1,
            source="prometheus",
            prometheus_url=url,
        )
        try:
            deadline = time.monotonic() + 20
            names: set[str] = set()
            while time.monotonic() < deadline and "rl.host.memory.growth" not in names:
                data = reader.get_metrics_data()
                names = {
                    metric.name
                    for resource in (data.resource_metrics if data else [])
                    for scope in resource.scope_metrics
                    for metric in scope.metrics
                    if any(True for _ in metric.data.data_points)
                }
                time.sleep(0.05)
        finally:
            shutdown_telemetry()
    assert "rl.host.memory.growth" in names
    assert "rl.host.memory.time_to_limit" in names
    assert "rl.host.memory.used" not in names


def test_a_redirect_is_not_followed_so_credentials_stay_with_the_server_given() -> None:
    elsewhere = _fake()
    redirecting = _fake()
    with elsewhere.running() as other_url, redirecting.running() as url:
        redirecting.redirect_to = f"{other_url}/api/v1/query"
        settings = PrometheusSettings.from_env(
            url=url, environ={"RAYLENS_PROMETHEUS_TOKEN": "s3cret"}
        )
        answers = fetch_answers(settings, (Query.DOWN,))
    assert answers[Query.DOWN].body is None
    assert "HTTP status 307" in str(answers[Query.DOWN].error)
    assert elsewhere.calls == []


def test_a_compressed_answer_is_refused_not_inflated() -> None:
    fake = _fake()
    fake.gzip = True
    with fake.running() as url:
        answers = fetch_answers(PrometheusSettings(url), (Query.NODE_USED,))
    assert answers[Query.NODE_USED].body is None
    assert "compressed answer (gzip) is refused" in str(answers[Query.NODE_USED].error)
