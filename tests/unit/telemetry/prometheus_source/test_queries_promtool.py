"""The source's PromQL evaluated by Prometheus' own engine (``promtool test rules``; slow tier).

Two samplers publish on one node (a replaced one's series linger until Ray ages them
out): only the freshest one's figures come back, aggregated to the labels read, NaN left
out; a target that is up sends nothing in the down query; only growing nodes are listed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from raylens.telemetry.prometheus_source import Query, query_text

pytestmark = pytest.mark.slow

FRESH = {"job": "ray", "instance": "n:1", "WorkerId": "new"}
STALE = {"job": "ray", "instance": "n:1", "WorkerId": "old"}


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    shown = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{shown}}}", "values": values}


def _case(query: Query, samples: list[dict[str, object]]) -> dict[str, object]:
    return {"expr": query_text(query), "eval_time": "1m", "exp_samples": samples}


def test_the_queries_read_only_the_freshest_sampler_and_what_carries_a_figure(
    tmp_path: Path, promtool_test_rules: Callable[..., None]
) -> None:
    group = "ray_raylens_worker_group_"
    node = "ray_raylens_node_memory_"
    inputs = [
        _series("up", {"job": "ray", "instance": "n:1"}, "1x2"),
        _series("up", {"job": "ray", "instance": "gone:1"}, "0x2"),
        _series("ray_raylens_sampler_sampled_at_seconds", FRESH, "100x2"),
        _series("ray_raylens_sampler_sampled_at_seconds", STALE, "50x2"),
        _series(
            f"{group}memory_bytes",
            {**FRESH, "rl_worker_group": "policy", "memory_type": "rss"},
            "7x2",
        ),
        _series(
            f"{group}memory_bytes", {**STALE, "rl_worker_group": "old", "memory_type": "rss"}, "9x2"
        ),
        _series(f"{group}processes", {**FRESH, "rl_worker_group": "policy"}, "3x2"),
        _series(f"{group}pss_age_seconds", {**FRESH, "rl_worker_group": "policy"}, "30x2"),
        _series(
            f"{group}memory_growth_bytes_per_second",
            {**FRESH, "rl_worker_group": "policy"},
            "NaN NaN NaN",
        ),
        _series(f"{node}used_bytes", FRESH, "5x2"),
        _series(f"{node}used_bytes", STALE, "6x2"),
        _series(f"{node}limit_bytes", FRESH, "8x2"),
        _series(f"{node}time_to_limit_seconds", FRESH, "NaN NaN NaN"),
        _series(f"{node}growing", FRESH, "1x2"),
        _series(f"{node}growing", STALE, "0x2"),
        _series(
            "ray_raylens_sampler_growth_window_seconds",
            {**FRESH, "rl_sampler": "a1", "rl_started_by": "h/1"},
            "40x2",
        ),
    ]
    groups = [
        {"labels": '{instance="n:1",k="by",rl_worker_group="policy"}', "value": 7},
        {"labels": '{instance="n:1",k="pr",rl_worker_group="policy"}', "value": 3},
        {"labels": '{instance="n:1",k="ps",rl_worker_group="policy"}', "value": 30},
    ]
    figures = [
        {"labels": '{instance="n:1",k="u"}', "value": 5},
        {"labels": '{instance="n:1",k="l"}', "value": 8},
    ]
    document = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    _case(Query.DOWN, [{"labels": 'up{instance="gone:1",job="ray"}', "value": 0}]),
                    _case(Query.GROUPS, groups),
                    _case(Query.NODE_FIGURES, figures),
                    _case(Query.GROWING, [{"labels": '{instance="n:1"}', "value": 1}]),
                    _case(Query.SAMPLED_AT, [{"labels": '{instance="n:1"}', "value": 100}]),
                    _case(
                        Query.WINDOW,
                        [
                            {
                                "labels": '{instance="n:1",rl_sampler="a1",rl_started_by="h/1"}',
                                "value": 40,
                            }
                        ],
                    ),
                ],
            }
        ],
    }
    promtool_test_rules(tmp_path / "queries.test.yml", document)
