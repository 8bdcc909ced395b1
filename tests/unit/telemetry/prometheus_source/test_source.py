"""The Prometheus source against a fake Prometheus API, in process (no sockets)."""

from __future__ import annotations

import json
import logging

import pytest

from raylens.telemetry.prometheus_source import (
    Answer,
    PrometheusSettings,
    PrometheusSource,
    Query,
)
from raylens_fakes.clock import ManualClock
from raylens_fakes.cluster import FakeCluster
from raylens_fakes.prometheus_api import FakePrometheus, FakeTarget

GIB = 1024**3


def _source(fake: FakePrometheus, **kw: object) -> PrometheusSource:
    settings = PrometheusSettings("http://127.0.0.1:9090", scrape_interval_s=5.0)
    return PrometheusSource(
        settings,
        interval=5.0,
        fetch=fake.fetch,
        clock=ManualClock(500.0),
        wall=lambda: fake.now,
        **kw,
    )


def _fleet(nodes: int) -> FakePrometheus:
    fake = FakePrometheus(now=1_000.0)
    for index in range(nodes):
        fake.targets[f"10.0.0.{index}:8080"] = FakeTarget(
            ip=f"10.0.0.{index}",
            used=(index + 1) * GIB,
            scraped_at=999.0,
            sampled_at=998.5,
            groups={"policy": (2 * GIB, 1.5 * GIB, 4.0, 1024.0), "rollout": (GIB, None, 2.0, None)},
            node=(3 * GIB, 2048.0, 0.0, 1.0, 60 * GIB, 900.0, 600.0),
            pss_ages={"policy": 42.0, "rollout": 7.0},  # rollout's has no PSS beside it
        )
    return fake


def test_a_cycle_sends_the_same_fixed_queries_whatever_the_number_of_nodes() -> None:
    asked = []
    for nodes in (1, 50):
        fake = _fleet(nodes)
        _source(fake).collect_once()
        asked.append(sorted(fake.calls))
    assert asked[0] == asked[1]
    assert len(asked[0]) == len(Query)


def test_the_readme_says_how_many_queries_a_cycle_sends() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[4] / "README.md").read_text(encoding="utf-8")
    assert f"fixed set of {len(Query)} instant queries" in readme


def test_nodes_groups_and_growth_come_from_the_series() -> None:
    fake = _fleet(2)
    source = _source(fake)
    source.collect_once()
    samples = source.latest()
    assert [s.node_id for s in samples] == ["10.0.0.0:8080", "10.0.0.1:8080"]
    first = samples[0]
    assert (first.used, first.total, first.error) == (GIB, 64 * GIB, None)
    assert first.host == "10.0.0.0"
    assert first.worker_groups == "policy,rollout"
    host, figures, _at = source.group_figures()["10.0.0.0:8080"]
    assert host == "10.0.0.0" and figures.sampled_at == 998.5
    assert figures.rows == (
        ("policy", 2 * GIB, 1.5 * GIB, 4.0, 1024.0, 42.0),
        ("rollout", GIB, None, 2.0, None, None),
    )
    assert figures.node is not None
    assert (figures.node.growth, figures.node.growing, figures.node.time_to_limit) == (
        2048.0,
        True,
        900.0,
    )
    assert (figures.node.window_s, figures.node.sampler) == (600.0, "actor-1")


def test_a_node_whose_series_are_older_than_two_scrape_intervals_is_failing_with_its_age() -> None:
    fake = _fleet(2)
    fake.targets["10.0.0.1:8080"].scraped_at = 1_000.0 - 11.0
    source = _source(fake)
    source.collect_once()
    fresh, old = source.latest()
    assert fresh.error is None
    assert old.error is not None and "11 s old" in old.error and "5 s scrape interval" in old.error
    assert "10.0.0.1:8080" not in source.group_figures()


def test_a_stopped_node_stays_listed_as_failing_while_prometheus_lists_its_target() -> None:
    fake = _fleet(2)
    source = _source(fake)
    source.collect_once()
    gone = fake.targets["10.0.0.1:8080"]
    gone.up, gone.series = 0.0, False  # Prometheus marked its series stale
    fake.now += 7.0
    source.collect_once()
    samples = {s.node_id: s for s in source.latest()}
    failing = samples["10.0.0.1:8080"]
    assert failing.error is not None and "up 0" in failing.error and "8 s old" in failing.error
    assert failing.used == 2 * GIB  # the last figures stand, as in direct scraping
    del fake.targets["10.0.0.1:8080"]  # the target left the service-discovery file
    source.collect_once()
    assert [s.node_id for s in source.latest()] == ["10.0.0.0:8080"]


def test_targets_without_node_memory_series_are_not_nodes() -> None:
    fake = _fleet(1)
    fake.targets["10.0.0.9:44217"] = FakeTarget(series=False)  # the autoscaler's endpoint
    source = _source(fake)
    source.collect_once()
    assert [s.node_id for s in source.latest()] == ["10.0.0.0:8080"]


def test_an_unanswering_prometheus_makes_every_known_node_fail_and_says_why() -> None:
    fake = _fleet(1)
    source = _source(fake)
    source.collect_once()

    def down(_settings: PrometheusSettings, queries: tuple[Query, ...]) -> dict:
        return {query: Answer(None, "ConnectionRefusedError: refused", 0.0) for query in queries}

    source.fetch = down
    source.collect_once()
    (sample,) = source.latest()
    assert sample.error is not None and "did not answer the node_used query" in sample.error
    assert "refused" in sample.error
    assert source.group_figures() == {}


def test_a_failed_node_memory_query_keeps_every_known_node_listed_as_failing() -> None:
    fake = _fleet(2)
    source = _source(fake)
    source.collect_once()
    fake.override[Query.NODE_USED] = b'{"status":"error","errorType":"timeout","error":"slow"}'
    source.collect_once()
    samples = source.latest()
    assert len(samples) == 2
    assert all(
        s.error is not None and "node_used" in s.error and "slow" in s.error for s in samples
    )


def test_one_failed_query_costs_only_its_own_figures() -> None:
    fake = _fleet(1)
    fake.override[Query.GROUPS] = b'{"status":"error","errorType":"timeout","error":"x"}'
    source = _source(fake)
    source.collect_once()
    (sample,) = source.latest()
    assert sample.error is None and sample.used == GIB
    _host, figures, _at = source.group_figures()["10.0.0.0:8080"]
    assert figures.rows == ()
    assert figures.node is not None and figures.node.growth == 2048.0
    assert any(line.startswith("groups") for line in source.query_errors())


def test_kill_counters_sum_the_raylets_series_per_node() -> None:
    fake = _fleet(1)
    fake.targets["10.0.0.0:8080"].evictions = {"policy-0:Hog.f": 2.0, "rollout-0:X.y": 1.0}
    fake.targets["10.0.0.0:8080"].kernel_kills = 4.0
    source = _source(fake)
    source.collect_once()
    _host, counts, _at = source.oom_counts()["10.0.0.0:8080"]
    assert counts.ray_evictions == 3.0 and counts.kernel_oom_kills == 4.0
    assert counts.ray_victims == (("policy-0:Hog.f", 2.0), ("rollout-0:X.y", 1.0))


def test_nodes_are_named_by_the_connected_cluster_when_there_is_one(
    fake_cluster: FakeCluster,
) -> None:
    fake = _fleet(1)
    fake_cluster.add_node(node_id="ab" * 28, address="10.0.0.0", port=8080, hostname="n0")
    source = _source(fake, cluster=fake_cluster)
    source.collect_once()
    (sample,) = source.latest()
    assert (sample.node_id, sample.host) == ("ab" * 28, "n0")


def test_impossible_figures_are_refused_as_from_a_payload(
    caplog: pytest.LogCaptureFixture, raylens_state: None
) -> None:
    fake = _fleet(1)
    target = fake.targets["10.0.0.0:8080"]
    target.groups["forged"] = (1e20, None, 2.5, None)  # more than the node holds
    target.groups["policy"] = (2 * GIB, None, 4.0, 1e30)  # a rate past the node's total
    target.kernel_kills = 1e12
    source = _source(fake)
    with caplog.at_level(logging.WARNING, logger="raylens"):
        source.collect_once()
    _host, figures, _at = source.group_figures()["10.0.0.0:8080"]
    assert [row[0] for row in figures.rows] == ["policy", "rollout"]
    assert figures.rows[0] == ("policy", 2 * GIB, None, 4.0, None, None)
    assert "10.0.0.0:8080" not in source.oom_counts()  # its one counter was refused
    assert "no machine can have" in caplog.text and "forged" in caplog.text


def test_the_node_count_is_bounded() -> None:
    fake = _fleet(5)
    source = _source(fake, max_nodes=3)
    source.collect_once()
    assert len(source.latest()) == 3


def test_hooks_run_after_each_cycle_and_on_stop() -> None:
    fake = _fleet(1)
    source = _source(fake)
    seen: list[int] = []
    stopped: list[bool] = []
    source.add_cycle_hook(
        lambda s: seen.append(len(s.latest())), on_stop=lambda: stopped.append(True)
    )
    source.collect_once()
    source.stop()
    assert seen == [1] and stopped == [True] and source.latest() == []


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[" * 100_000,
        b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": 3}}).encode(),
    ],
)
def test_a_malformed_answer_is_that_query_s_error_only(body: bytes) -> None:
    fake = _fleet(1)
    fake.override[Query.NODE_TOTAL] = body
    source = _source(fake)
    source.collect_once()
    (sample,) = source.latest()
    assert sample.used == GIB and sample.total is None and sample.error is None


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"RAYLENS_PROMETHEUS_JOB": 'ray"} or up{x="'}, "RAYLENS_PROMETHEUS_JOB"),
        ({"RAYLENS_PROMETHEUS_SCRAPE_INTERVAL": "soon"}, "RAYLENS_PROMETHEUS_SCRAPE_INTERVAL"),
        ({"RAYLENS_PROMETHEUS_USER": "ann"}, "go together"),
        (
            {
                "RAYLENS_PROMETHEUS_TOKEN": "t",
                "RAYLENS_PROMETHEUS_USER": "a",
                "RAYLENS_PROMETHEUS_PASSWORD": "p",
            },
            "not both",
        ),
        ({}, "no Prometheus URL"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(env: dict[str, str], said: str) -> None:
    url = None if not env else "http://127.0.0.1:9090"
    with pytest.raises(ValueError, match=said):
        PrometheusSettings.from_env(url=url, environ=env)


def test_secrets_never_show_in_the_settings_repr() -> None:
    settings = PrometheusSettings.from_env(
        url="https://p.example:9090", environ={"RAYLENS_PROMETHEUS_TOKEN": "s3cret"}
    )
    assert "s3cret" not in repr(settings)


def test_tls_is_verified_against_the_system_or_the_given_authorities() -> None:
    import ssl

    from raylens.telemetry.prometheus_source._client import _ssl_context

    context = _ssl_context(PrometheusSettings("https://prom.example:9090"))
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert _ssl_context(PrometheusSettings("http://127.0.0.1:9090")) is None
