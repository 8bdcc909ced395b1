"""A fake raylet's machine is never smaller than the container it reports."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raylens_fakes import FakeRaylet

GIB = 1024**3


def _samples(body: bytes) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


@pytest.mark.parametrize("template", ["worker", "head"])
@pytest.mark.parametrize(
    ("used", "total"), [(32 * GIB, 64 * GIB), (0.5 * GIB, 1 * GIB), (30 * GIB, 30 * GIB)]
)
def test_the_machine_holds_the_node_it_reports(template: str, used: float, total: float) -> None:
    with FakeRaylet(used, total, template=template) as raylet:
        samples = _samples(raylet.payload())
    assert samples["ray_node_mem_used"] == used
    assert samples["ray_node_mem_total"] == total
    assert samples["ray_node_mem_total_host"] >= total
    assert samples["ray_node_mem_used_host"] >= used
    assert samples["ray_node_mem_used_host"] <= samples["ray_node_mem_total_host"]


def test_a_small_node_keeps_the_recorded_machine() -> None:
    with FakeRaylet(1 * GIB, 2 * GIB) as raylet:
        samples = _samples(raylet.payload())
    assert samples["ray_node_mem_total_host"] == 2.5276063744e10
    assert samples["ray_node_mem_used_host"] == 1.63254272e09


def test_the_simulate_command_shows_no_machine_smaller_than_its_node() -> None:
    from raylens.cli.cluster_views import _simulated_memory

    used, total = _simulated_memory(0, 0.0)
    with FakeRaylet(memory=lambda: (used, total)) as raylet:
        samples = _samples(raylet.payload())
    assert samples["ray_node_mem_total_host"] >= samples["ray_node_mem_total"] == total
