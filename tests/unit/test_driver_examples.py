"""The example drivers' Ray-free parts: own-group labels on a simulated cluster, flags, the worker."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from raylens.cluster import use_cluster_view
from raylens.telemetry.host_memory import RL_HOST_MEMORY_USED_METRIC, HostMemoryMonitor

_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_GIB = 1024**3


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import ``examples/<name>.py`` as a script would see it (its folder on the path)."""
    monkeypatch.syspath_prepend(str(_EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"_example_{name}", _EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def _labels_after_one_collection(sim, monitor, metrics_probe) -> dict[str, str]:
    """Node index -> its ``rl.worker_groups`` label after a single collection."""
    monitor.collect_once()
    labels = {}
    for attributes in metrics_probe.points(RL_HOST_MEMORY_USED_METRIC):
        attrs = dict(attributes)
        labels[attrs["ray.node.id"]] = attrs["rl.worker_groups"]
    return {str(sim.index_of(node_id)): label for node_id, label in labels.items()}


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """examples/driver.py, importing a stand-in for Ray (never called by these tests)."""
    monkeypatch.setitem(sys.modules, "ray", ModuleType("ray"))
    return _load("driver", monkeypatch)


@pytest.fixture
def own_groups(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _load("own_groups", monkeypatch)


@pytest.fixture
def sim(simulated_cluster, raylens_state):
    """Three simulated nodes, raylens' default cluster for the test."""
    cluster = simulated_cluster(3, schedule=lambda node, t: ((node + 1) * _GIB, 8 * _GIB))
    with use_cluster_view(cluster.cluster):
        yield cluster


@pytest.fixture
def monitor(sim):
    """A monitor built as a driver builds it, with no ``cluster=``.

    Kept for the whole test, since a monitor's points are exported only while it exists.
    """
    made = HostMemoryMonitor(1.0, scrape_timeout=5.0)
    yield made
    made.stop()


@pytest.mark.slow
def test_a_placement_label_shows_in_the_first_collection_and_goes_with_the_block(
    own_groups, sim, monitor, metrics_probe
) -> None:
    group = sim.cluster.create_placement_group({0: sim.node_id(0), 1: sim.node_id(1)})

    with own_groups.placement_label("trainer", group):
        inside = _labels_after_one_collection(sim, monitor, metrics_probe)
    after = _labels_after_one_collection(sim, monitor, metrics_probe)

    assert inside == {"0": "trainer", "1": "trainer", "2": "none"}
    assert after == {"0": "none", "1": "none", "2": "none"}


@pytest.mark.slow
def test_a_placement_label_can_name_some_bundles_only(
    own_groups, sim, monitor, metrics_probe
) -> None:
    group = sim.cluster.create_placement_group({0: sim.node_id(0), 1: sim.node_id(2)})

    with own_groups.placement_label("trainer", group, bundle_indices=[1]):
        labels = _labels_after_one_collection(sim, monitor, metrics_probe)

    assert labels == {"0": "none", "1": "none", "2": "trainer"}


@pytest.mark.slow
def test_node_and_placement_labels_combine_on_a_shared_node(
    own_groups, sim, monitor, metrics_probe
) -> None:
    group = sim.cluster.create_placement_group({0: sim.node_id(1)})

    with (
        own_groups.placement_label("trainer", group),
        own_groups.nodes_label("samplers", [sim.node_id(1), sim.node_id(2)]),
    ):
        labels = _labels_after_one_collection(sim, monitor, metrics_probe)

    assert labels == {"0": "none", "1": "samplers,trainer", "2": "samplers"}


@pytest.mark.slow
def test_a_label_goes_when_the_group_fails_inside_its_block(
    own_groups, sim, monitor, metrics_probe
) -> None:
    with (
        pytest.raises(RuntimeError, match="worker died"),
        own_groups.nodes_label("samplers", [sim.node_id(0)]),
    ):
        raise RuntimeError("worker died")

    assert _labels_after_one_collection(sim, monitor, metrics_probe) == {
        "0": "none",
        "1": "none",
        "2": "none",
    }


def test_the_driver_example_refuses_a_bad_duration_naming_it(
    driver: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        driver._parse_args(["--duration", "0"])

    assert exit_info.value.code == 2
    assert "--duration 0.0 must be a positive number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize("duration", ["inf", "-inf", "nan", "-1", "1e300"])
def test_the_driver_example_refuses_a_duration_it_cannot_sleep_before_starting_anything(
    driver: ModuleType, capsys: pytest.CaptureFixture[str], duration: str
) -> None:
    # The stand-in for Ray has no init: reaching Ray or any group would raise instead.
    with pytest.raises(SystemExit) as exit_info:
        driver.main([f"--duration={duration}"])

    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--duration {float(duration)} must be a positive number of seconds" in err
    assert "finite" in err


def test_the_driver_example_joins_ray_address_or_starts_its_own(
    driver: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert driver._parse_args([]).address is None

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert driver._parse_args([]).address == "10.0.0.5:6379"


def test_the_example_worker_holds_what_it_is_asked_and_shares_a_bundle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers = _load("workers", monkeypatch)

    worker = workers.MemoryWorker(megabytes=2)
    options, env, kwargs = workers.MemoryWorker.configure_worker(0)

    assert len(worker._block) == 2 * 1024 * 1024
    assert options == {"num_cpus": 0.5}
    assert (env, kwargs) == ({}, {})
