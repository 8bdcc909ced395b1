"""The dashboard's subtler queries give the right answer, checked by Prometheus' own evaluator.

``promtool test rules`` evaluates PromQL over series written out here, with no server and no
network; where the Prometheus tools are not installed these tests are skipped, saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_dashboards import load_dashboard, query_panels, variable_promql

pytestmark = pytest.mark.slow  # runs promtool

# One machine "vm" with two Ray nodes: "a" runs policy and rollout, "b" runs no group.
_SERIES = {
    'rl_host_memory_used_bytes{host_name="vm",ray_node_id="a",rl_worker_groups="policy,rollout"}': 100,
    'rl_host_memory_used_bytes{host_name="vm",ray_node_id="b",rl_worker_groups="none"}': 80,
    'rl_host_memory_total_bytes{host_name="vm",ray_node_id="a",rl_worker_groups="policy,rollout"}': 1000,
    'rl_host_memory_total_bytes{host_name="vm",ray_node_id="b",rl_worker_groups="none"}': 1000,
    'rl_worker_group_memory_usage_bytes{host_name="vm",ray_node_id="a",rl_worker_group="policy",memory_type="pss"}': 30,
    'rl_worker_group_memory_usage_bytes{host_name="vm",ray_node_id="a",rl_worker_group="rollout",memory_type="pss"}': 20,
    # A group whose processes are measured but whose nodes carry no label of it.
    'rl_worker_group_processes{host_name="vm",ray_node_id="b",rl_worker_group="samplers"}': 2,
}


def _all(expr: str) -> str:
    """``expr`` as the dashboard runs it with every variable at "All"."""
    return expr.replace("${worker_group}", ".*").replace("$host", ".*")


def _promql_test(series: dict[str, str], cases: list[dict[str, Any]]) -> dict[str, Any]:
    """A promtool test document: ``series`` (each with its values, one a minute), ``cases``."""
    return {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": cases,
            }
        ],
    }


def _evaluate(
    promtool_test_rules: Callable[..., None],
    tmp_path: Path,
    expr: str,
    expected: list[tuple[str, float]],
) -> None:
    series = {name: f"{value} {value}" for name, value in _SERIES.items()}
    samples = [{"labels": labels, "value": value} for labels, value in expected]
    test = _promql_test(series, [{"expr": expr, "eval_time": "1m", "exp_samples": samples}])
    promtool_test_rules(tmp_path / "dashboard_test.yml", test)


def test_memory_outside_groups_keeps_nodes_without_groups_and_their_host(
    tmp_path: Path, promtool_test_rules: Callable[..., None]
) -> None:
    (panel,) = [p for p in query_panels(load_dashboard()) if p["title"].startswith("Node memory")]
    expected = [('{host_name="vm",ray_node_id="a"}', 50), ('{host_name="vm",ray_node_id="b"}', 80)]
    _evaluate(promtool_test_rules, tmp_path, _all(panel["targets"][0]["expr"]), expected)


def test_the_worker_group_variable_sees_node_labels_and_group_series(
    tmp_path: Path, promtool_test_rules: Callable[..., None]
) -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    expr = variable_promql(variables["worker_group"]["query"]["query"])
    expected = [
        ('{rl_worker_groups="policy,rollout"}', 1),
        ('{rl_worker_groups="none"}', 1),
        ('{rl_worker_groups="samplers"}', 1),
    ]
    _evaluate(promtool_test_rules, tmp_path, expr, expected)


def test_the_oom_alert_sees_a_first_kill_and_a_rise_but_not_old_kills(
    tmp_path: Path, promtool_test_rules: Callable[..., None]
) -> None:
    from test_dashboards import load_alert_rules

    (rule,) = [r for r in load_alert_rules() if r["alert"] == "RaylensWorkerKilledForMemory"]
    # Over 20 minutes: "old" was killed once before the window; "first" has its first kill
    # 5 minutes before the evaluation (its series appears then); "again" is killed a second time.
    series = {
        'rl_host_oom_kills_total{ray_node_id="old",killer="ray"}': "1x20",
        'rl_host_oom_kills_total{ray_node_id="first",killer="kernel"}': "_x15 1x5",
        'rl_host_oom_kills_total{ray_node_id="again",killer="ray"}': "1x14 2x6",
    }
    cases = [
        {
            "expr": f"count by (ray_node_id, killer) ({rule['expr']})",
            "eval_time": "20m",
            "exp_samples": [
                {"labels": '{ray_node_id="again",killer="ray"}', "value": 1},
                {"labels": '{ray_node_id="first",killer="kernel"}', "value": 1},
            ],
        }
    ]
    promtool_test_rules(tmp_path / "promql_test.yml", _promql_test(series, cases))


def test_the_growth_panels_keep_only_nodes_of_the_chosen_group(
    tmp_path: Path, promtool_test_rules: Callable[..., None]
) -> None:
    panels = {p["title"]: p for p in query_panels(load_dashboard())}
    expr = panels["Time to the kill line"]["targets"][0]["expr"]
    chosen = expr.replace("${worker_group}", "rollout").replace("$host", ".*")
    series = {
        'rl_host_memory_time_to_limit_seconds{host_name="vm",ray_node_id="a",rl_worker_groups="policy,rollout"}': "600 600",
        'rl_host_memory_time_to_limit_seconds{host_name="vm",ray_node_id="b",rl_worker_groups="policy"}': "900 900",
    }
    cases = [
        {
            "expr": chosen,
            "eval_time": "1m",
            "exp_samples": [
                {
                    "labels": 'rl_host_memory_time_to_limit_seconds{host_name="vm",ray_node_id="a",rl_worker_groups="policy,rollout"}',
                    "value": 600,
                }
            ],
        }
    ]
    promtool_test_rules(tmp_path / "promql_test.yml", _promql_test(series, cases))


def test_the_phase_panels_take_each_groups_largest_peak_and_sum_what_it_left(
    tmp_path: Path, promtool_test_rules: Callable[..., None]
) -> None:
    panels = {p["title"]: p for p in query_panels(load_dashboard())}
    peak = _all(panels["Peak per phase and worker group (largest node)"]["targets"][0]["expr"])
    left = _all(panels["Memory left behind per phase and worker group"]["targets"][0]["expr"])
    where = 'host_name="vm",rl_phase="train",rl_worker_group="policy",rl_peak_source="kernel"'
    series = {
        f'rl_worker_group_memory_phase_peak_bytes{{{where},ray_node_id="a"}}': "400 400",
        f'rl_worker_group_memory_phase_peak_bytes{{{where},ray_node_id="b"}}': "300 300",
        f'rl_worker_group_memory_phase_delta_bytes{{{where},ray_node_id="a"}}': "10 10",
        f'rl_worker_group_memory_phase_delta_bytes{{{where},ray_node_id="b"}}': "-4 -4",
    }
    labels = '{rl_phase="train",rl_worker_group="policy"}'
    cases = [
        {
            "expr": peak,
            "eval_time": "1m",
            "exp_samples": [{"labels": labels, "value": 400}],
        },
        {
            "expr": left,
            "eval_time": "1m",
            "exp_samples": [{"labels": labels, "value": 6}],
        },
    ]
    promtool_test_rules(tmp_path / "promql_test.yml", _promql_test(series, cases))
