"""Values another job can publish under raylens' names are held to physical bounds.

Any job on a cluster can publish, through ``ray.util.metrics``, series with raylens' names
on any node's endpoint; a value no machine can have is refused where the payload is
parsed, before it is rounded, recorded, exported or printed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import pytest
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics

from raylens.distributed.group_memory_cycle import GroupMemoryCycle
from raylens.distributed.group_memory_sampler import SamplerError
from raylens.live_table import format_growth
from raylens.telemetry import host_memory as hm
from raylens.telemetry.group_memory import (
    GroupMemorySnapshot,
    GroupWorkerRegistry,
    register_group_memory_gauges,
)
from raylens.telemetry.physical_bounds import MAX_PROCESSES, bound_payload
from raylens.telemetry.raylet_payload import TOTAL_KEY, USED_KEY, NodeGroupFigures
from raylens.telemetry.scraping import Outcome, outcome_of_payload
from raylens_fakes import MetricsProbe

NODE = "a" * 56
GIB = 1024**3


def _payload(*group_lines: str, total: str = "6.4e10", used: str = "3.2e10") -> bytes:
    lines = [
        f'ray_node_mem_total{{ip="10.0.0.1"}} {total}',
        f'ray_node_mem_used{{ip="10.0.0.1"}} {used}',
        'ray_raylens_sampler_sampled_at_seconds{WorkerId="w"} 1700000000',
        *group_lines,
    ]
    return ("\n".join(lines) + "\n").encode()


def _group(name: str, rss: str, processes: str = "2", growth: str | None = None) -> list[str]:
    labels = f'WorkerId="w",rl_worker_group="{name}"'
    lines = [
        f'ray_raylens_worker_group_memory_bytes{{{labels},memory_type="rss"}} {rss}',
        f"ray_raylens_worker_group_processes{{{labels}}} {processes}",
    ]
    if growth is not None:
        lines.append(
            f"ray_raylens_worker_group_memory_growth_bytes_per_second{{{labels}}} {growth}"
        )
    return lines


class _Samplers:
    def maintain(
        self, _workers: object, *, version: object = None, nodes: object = ()
    ) -> dict[str, SamplerError]:
        return {}

    def close(self) -> None: ...


class _Scraped:
    has_consumer = True
    max_age = 30.0

    def __init__(self, figures: NodeGroupFigures) -> None:
        self.figures = figures

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return {NODE: ("vm", self.figures, 1.0)}


def test_one_group_value_beyond_int64_does_not_break_the_otlp_encoding_of_the_batch(
    metrics_probe: MetricsProbe,
) -> None:
    payload = _payload(
        *_group("forged", "1e300", processes="1e300"),
        *_group("forged-count", "1e9", processes="9.3e18"),
        *_group("policy", "2e9"),
    )
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.groups is not None
    snapshot = GroupMemorySnapshot()
    register_group_memory_gauges(snapshot)
    cycle = GroupMemoryCycle(_Samplers(), registry=GroupWorkerRegistry(), snapshot=snapshot)  # type: ignore[arg-type]
    cycle(_Scraped(outcome.groups))  # type: ignore[arg-type]

    data = metrics_probe.collect()
    assert data is not None
    encode_metrics(data)  # the whole batch encodes
    rss = metrics_probe.points_by("rl.worker_group.memory.usage", "rl.worker_group")
    assert rss == {"policy": 2e9, "forged-count": 1e9}
    processes = metrics_probe.points_by("rl.worker_group.processes", "rl.worker_group")
    assert processes == {"policy": 2, "forged-count": 0}  # its count was refused, not its RSS


def test_memory_is_bounded_by_the_nodes_total_and_counts_by_the_largest_pid() -> None:
    payload = _payload(
        *_group("over-total", "6.5e10"),
        *_group("at-total", "6.4e10", processes=str(MAX_PROCESSES)),
        *_group("half-process", "1e9", processes="1.5"),
        *_group("many", "1e9", processes=str(MAX_PROCESSES + 1)),
    )
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.groups is not None
    rows = {row[0]: row for row in outcome.groups.rows}
    assert set(rows) == {"at-total", "half-process", "many"}
    assert rows["at-total"][3] == MAX_PROCESSES
    assert rows["half-process"][3] is None and rows["many"][3] is None
    assert outcome.refused is not None and outcome.refused[0] == 3


def test_a_forged_growth_is_bounded_by_the_nodes_total_per_second() -> None:
    payload = _payload(
        *_group("forged", "1e9", growth="1e300"),
        *_group("fast", "1e9", growth="6.4e10"),
    )
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.groups is not None
    growth = {row[0]: row[4] for row in outcome.groups.rows}
    assert growth == {"forged": None, "fast": 6.4e10}
    # What can still be shown prints as a short figure.
    assert len(format_growth(6.4e10)) < 20


def test_a_pss_age_is_believed_only_from_zero_to_a_week() -> None:
    lines = []
    for name, age in (("fine", "90"), ("negative", "-5"), ("forged", "1e300"), ("inf", "+Inf")):
        labels = f'WorkerId="w",rl_worker_group="{name}"'
        lines += _group(name, "1e9")
        lines.append(f'ray_raylens_worker_group_memory_bytes{{{labels},memory_type="pss"}} 5e8')
        lines.append(f"ray_raylens_worker_group_pss_age_seconds{{{labels}}} {age}")
    payload = _payload(*lines)
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.groups is not None
    ages = {figure.group: figure.pss_age_s for figure in outcome.groups.groups}
    # The exposition's reader drops negative and infinite values before the bounds.
    assert ages == {"fine": 90.0, "negative": None, "forged": None, "inf": None}
    assert all(figure.pss_bytes == 5e8 for figure in outcome.groups.groups)
    assert outcome.refused is not None and any("pss_age" in named for named in outcome.refused[1])


def test_a_refused_pss_takes_its_age_with_it() -> None:
    labels = 'WorkerId="w",rl_worker_group="forged"'
    payload = _payload(
        *_group("forged", "1e9"),
        f'ray_raylens_worker_group_memory_bytes{{{labels},memory_type="pss"}} 1e300',
        f"ray_raylens_worker_group_pss_age_seconds{{{labels}}} 5",
    )
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.groups is not None
    (figure,) = outcome.groups.groups
    assert (figure.rss_bytes, figure.pss_bytes, figure.pss_age_s) == (1e9, None, None)


def test_node_figures_beyond_any_machine_are_refused_and_the_rest_kept() -> None:
    bounded = bound_payload({USED_KEY: 1e300, TOTAL_KEY: 6.4e10}, None, None)
    assert bounded.values == {TOTAL_KEY: 6.4e10} and bounded.refused_count == 1
    payload = _payload(total="1e300", used="1e300")
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.values is None and "physical bounds" in (outcome.error or "")


def test_forged_kill_counters_are_refused() -> None:
    payload = _payload() + (
        b'ray_memory_manager_worker_eviction_total{Type="Actor",Name="x"} 1e300\n'
        b'ray_raylens_node_oom_kills{oom_source="vmstat"} 3\n'
    )
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.oom is not None
    assert outcome.oom.ray_evictions is None and outcome.oom.kernel_oom_kills == 3


def test_a_group_far_above_the_total_never_reaches_the_memory_outside_the_groups() -> None:
    used = 3.2e10
    for rss in ("0", "1e300", "0", "1e300"):
        payload = _payload(*_group("g", rss), used=str(used))
        outcome = outcome_of_payload(payload, len(payload))
        assert outcome.values is not None and outcome.groups is not None
        inside = sum(row[1] for row in outcome.groups.rows)
        outside = outcome.values[USED_KEY] - inside
        assert 0 <= outside <= used  # what the growth history records as outside


def test_refused_values_are_named_in_one_warning_per_node(
    caplog: pytest.LogCaptureFixture, one_node_monitor: Callable[..., hm.HostMemoryMonitor]
) -> None:
    payload = _payload(*_group("forged", "1e300"), *_group("policy", "2e9"))
    outcome = outcome_of_payload(payload, len(payload))
    assert outcome.refused is not None

    monitor = one_node_monitor(outcome)
    with caplog.at_level(logging.WARNING, logger="raylens"):
        for _ in range(3):
            monitor.collect_once()
    monitor.stop()
    warnings = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warnings) == 1 and "1e+300" in warnings[0] and "forged" in warnings[0]


def test_the_wire_carries_refusals_to_the_driver() -> None:
    from raylens.telemetry.scraping import HeldFigures, decode_outcomes, encode_outcomes

    outcome = Outcome({USED_KEY: 1.0}, None, refused=(2, ("a=1e+300",)))
    rows = encode_outcomes([("k", "http://127.0.0.1:1/", False)], {"k": outcome}, set())
    decoded = decode_outcomes(rows, ["k"], 0.0, HeldFigures())
    assert decoded["k"].refused == (2, ("a=1e+300",))
    assert not math.isnan(decoded["k"].elapsed)


def test_a_group_alternating_zero_and_1e300_never_reaches_what_the_reader_holds() -> None:
    """Growth is the node's sampler's own (read from its procfs); what a reader takes from the
    endpoint is bounded, so a forged 1e300 group is refused and the real readings between
    are kept whole (H3-13)."""
    kept = refused = 0
    for second in range(40):
        rss = "0" if second % 2 else "1e300"
        payload = _payload(*_group("g", rss)).replace(
            b"1700000000", str(1_700_000_000 + second).encode()
        )
        outcome = outcome_of_payload(payload, len(payload))
        assert outcome.values is not None and outcome.groups is not None
        rows = {row[0]: row for row in outcome.groups.rows}
        if rss == "0":
            assert rows["g"][1] == 0
            kept += 1
        else:
            assert "g" not in rows and outcome.refused is not None
            refused += 1
    assert kept == refused == 20
