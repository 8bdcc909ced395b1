"""The pytest plugin's fixtures work in any order, and raylens can be pointed at a fake cluster."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.metrics import Observation

from raylens.cluster import RayClusterView, default_cluster_view, use_cluster_view
from raylens.lens import (
    OBSERVABLE_GAUGE,
    RecordedMetric,
    get_telemetry_handle,
    register_observable_gauge,
    unregister_observable_gauge,
)
from raylens_fakes import FakeCluster, MetricsProbe
from raylens_fakes.pytest_plugin import reset_raylens_state

_GAUGE = RecordedMetric("test.fixtures.gauge", OBSERVABLE_GAUGE, "By", "fixture-order gauge")


@pytest.fixture
def reported() -> Iterator[list[Observation]]:
    current = [Observation(1.0, {"node": "a"})]
    register_observable_gauge(_GAUGE, lambda options: current)
    yield current
    unregister_observable_gauge(_GAUGE.name)


def test_raylens_state_after_metrics_probe_leaves_the_probe_working(
    reported: list[Observation], metrics_probe: MetricsProbe, raylens_state: None
) -> None:
    assert get_telemetry_handle() is not None
    assert metrics_probe.points(_GAUGE.name) == {frozenset({("node", "a")}): 1.0}


def test_raylens_state_before_metrics_probe_leaves_the_probe_working(
    reported: list[Observation], raylens_state: None, metrics_probe: MetricsProbe
) -> None:
    assert metrics_probe.points(_GAUGE.name) == {frozenset({("node", "a")}): 1.0}


def test_a_reset_during_the_test_keeps_the_probe_reading(
    reported: list[Observation], metrics_probe: MetricsProbe
) -> None:
    reset_raylens_state()
    register_observable_gauge(_GAUGE, lambda options: reported)  # declarations were reset
    reported[:] = [Observation(3.0, {"node": "b"})]
    assert metrics_probe.points(_GAUGE.name) == {frozenset({("node", "b")}): 3.0}


def test_points_by_keys_points_on_one_attribute(
    reported: list[Observation], metrics_probe: MetricsProbe
) -> None:
    reported[:] = [
        Observation(1.0, {"node": "a", "group": "g"}),
        Observation(2.0, {"node": "b", "group": "g"}),
    ]
    assert metrics_probe.points_by(_GAUGE.name, "node") == {"a": 1.0, "b": 2.0}
    with pytest.raises(ValueError, match=r"two points .* group='g'"):
        metrics_probe.points_by(_GAUGE.name, "group")
    with pytest.raises(ValueError, match=r"no attribute 'pid'"):
        metrics_probe.points_by(_GAUGE.name, "pid")
    assert metrics_probe.points_by("test.fixtures.absent", "node") == {}


def test_a_probe_outside_the_fixture_is_not_reinstalled_by_a_reset() -> None:
    probe = MetricsProbe().install()
    reset_raylens_state()
    assert get_telemetry_handle() is None
    probe.install()  # a second install takes a fresh reader
    assert get_telemetry_handle() is not None


# use_cluster_view -----------------------------------------------------------------------


def test_use_cluster_view_replaces_the_default_and_restores_it() -> None:
    outer, inner = FakeCluster(), FakeCluster()
    with use_cluster_view(outer):
        assert default_cluster_view() is outer
        with use_cluster_view(inner):
            assert default_cluster_view() is inner
        assert default_cluster_view() is outer
    assert isinstance(default_cluster_view(), RayClusterView)


def test_use_cluster_view_restores_after_an_error() -> None:
    with pytest.raises(KeyError), use_cluster_view(FakeCluster()):
        raise KeyError("boom")
    assert isinstance(default_cluster_view(), RayClusterView)


def test_use_cluster_view_is_seen_by_other_threads() -> None:
    cluster = FakeCluster()
    seen: list[object] = []
    with use_cluster_view(cluster):
        thread = threading.Thread(target=lambda: seen.append(default_cluster_view()))
        thread.start()
        thread.join(10)
    assert seen == [cluster]


def test_use_cluster_view_refuses_what_is_not_a_view() -> None:
    class HalfView:
        def nodes(self) -> list[dict[str, object]]:
            return []

    with (
        pytest.raises(TypeError, match=r"HalfView.*is_initialized, placement_group_table"),
        use_cluster_view(HalfView()),  # type: ignore[arg-type]
    ):
        pass


def test_fake_default_cluster_fixture_is_the_default(fake_default_cluster: FakeCluster) -> None:
    assert default_cluster_view() is fake_default_cluster
    assert default_cluster_view().is_initialized() is True


# Nothing at import ----------------------------------------------------------------------


# Each runs in a fresh interpreter (the slow tier) and fails there with an assertion.
_AT_IMPORT = {
    "lens_imports_nothing_above_it": (
        "import sys, raylens.lens\n"
        "above = ('raylens.telemetry', 'raylens.driver', 'raylens.distributed', 'raylens.cli')\n"
        "bad = [m for m in sys.modules if m.startswith(above)]\n"
        "assert not bad, bad\n"
    ),
    "the_plugin_starts_and_declares_nothing": (
        "import raylens_fakes.pytest_plugin\n"
        "from raylens.lens import get_telemetry_handle, recorded_metrics\n"
        "assert get_telemetry_handle() is None\n"
        "assert recorded_metrics() == {}, recorded_metrics()\n"
    ),
    # Every pytest run in an environment with raylens installed loads the plugin, so it
    # imports raylens, OpenTelemetry and the fakes only when a fixture asks for them.
    "the_plugin_loads_only_what_every_pytest_run_needs": (
        "import sys, raylens_fakes.pytest_plugin\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('raylens', 'opentelemetry', 'requests', 'aiohttp', 'psutil'))\n"
        "fakes = sorted(m for m in sys.modules if m.startswith('raylens_fakes.'))\n"
        "assert not heavy, heavy\n"
        "assert fakes == ['raylens_fakes.pytest_plugin'], fakes\n"
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("check", sorted(_AT_IMPORT))
def test_importing(check: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _AT_IMPORT[check]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_name_the_fakes_export_is_there_when_asked_for() -> None:
    import raylens_fakes

    for name in raylens_fakes.__all__:
        assert getattr(raylens_fakes, name).__name__ == name
    assert set(raylens_fakes.__all__) <= set(dir(raylens_fakes))
    with pytest.raises(AttributeError, match=r"raylens_fakes.*'FakeNothing'"):
        raylens_fakes.FakeNothing  # noqa: B018


def test_the_reset_forgets_group_workers_and_group_readings() -> None:
    from raylens.telemetry import group_memory
    from raylens.telemetry.group_memory import GroupMemory, NodeGroupMemory

    group_memory.register_group_workers("policy", [("node-a", 200, 1000)])
    reading = NodeGroupMemory("host-a", (GroupMemory("policy", 1024, None, None, 1, 1),))
    group_memory.DEFAULT_SNAPSHOT.publish({"node-a": reading})
    assert group_memory.DEFAULT_SNAPSHOT.latest()

    reset_raylens_state()

    assert group_memory.DEFAULT_WORKER_REGISTRY.workers_by_node() == {}
    assert group_memory.DEFAULT_SNAPSHOT.latest() == {}
