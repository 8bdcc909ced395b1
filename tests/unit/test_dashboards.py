"""The Grafana dashboard, the alert rules and the PromQL examples ask only for series raylens exports.

What raylens exports is not a hand-kept list: every :class:`~raylens.lens.RecordedMetric`
declared in a ``raylens.telemetry`` module is run through the OpenTelemetry Prometheus
exporter itself, and the sample names it writes are the names a query may use.

The helpers here are also what ``tests/integration/test_dashboard_prometheus.py`` uses
to pick the queries it runs against a real Prometheus.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "raylens.json"
ALERT_RULES = ROOT / "docs" / "prometheus" / "raylens-alerts.yml"
GUIDE = ROOT / "docs" / "dashboards.md"
README = ROOT / "README.md"

# What a query may contain besides metric names: PromQL's keywords.
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
    | {"and", "or", "unless", "offset", "inf", "nan"}
)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, labels left out)."""
    bare = _STRING.sub('""', expr)
    bare = _MATCHERS.sub("", bare)
    bare = _RANGE.sub("", bare)
    bare = _GROUPING.sub("", bare)
    return {
        match.group(1)
        for match in _NAME.finditer(bare)
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS
    }


def label_values_args(query: str) -> tuple[str, str]:
    """``(selector, label)`` of a ``label_values(selector, label)`` variable query."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\s*\)", query.strip())
    assert match, f"variable query {query!r} is not label_values(selector, label)"
    return match.group(1), match.group(2)


def variable_promql(query: str) -> str:
    """The PromQL a variable query runs: the selector of ``label_values(selector, label)``,
    or the expression of ``query_result(expression)``."""
    text = query.strip()
    if text.startswith("query_result(") and text.endswith(")"):
        return text[len("query_result(") : -1]
    return label_values_args(text)[0]


def variables(text: str) -> set[str]:
    """Grafana variables (``$name``, ``${name}``, ``${name:format}``) used in ``text``."""
    return {a or b for a, b in _VARIABLE.findall(text)}


def _raylens_metrics() -> dict[str, Any]:
    """Every RecordedMetric a module of ``raylens.telemetry`` or its packages declares, by name."""
    import raylens.telemetry
    from raylens.lens import RecordedMetric

    found: dict[str, Any] = {}
    for info in pkgutil.walk_packages(raylens.telemetry.__path__, "raylens.telemetry."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            items = value if isinstance(value, (tuple, list)) else (value,)
            for item in items:
                if isinstance(item, RecordedMetric):
                    found[item.name] = item
    return found


@cache
def exported_names() -> frozenset[str]:
    """The sample names raylens' series get from the OpenTelemetry Prometheus exporter."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    from raylens.lens import (
        COUNTER,
        GAUGE,
        HISTOGRAM,
        OBSERVABLE_COUNTER,
        OBSERVABLE_GAUGE,
        UP_DOWN_COUNTER,
    )

    registry = CollectorRegistry()
    try:
        reader = PrometheusMetricReader(registry=registry)
    except TypeError:  # releases before the registry argument use the global one
        from prometheus_client import REGISTRY as registry

        reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        meter = provider.get_meter("raylens")
        for metric in _raylens_metrics().values():
            args = {"name": metric.name, "unit": metric.unit, "description": metric.description}
            if metric.kind == OBSERVABLE_GAUGE:
                meter.create_observable_gauge(callbacks=[lambda _o: [Observation(1)]], **args)
            elif metric.kind == OBSERVABLE_COUNTER:
                meter.create_observable_counter(callbacks=[lambda _o: [Observation(1)]], **args)
            elif metric.kind == GAUGE:
                meter.create_gauge(**args).set(1)
            elif metric.kind == COUNTER:
                meter.create_counter(**args).add(1)
            elif metric.kind == UP_DOWN_COUNTER:
                meter.create_up_down_counter(**args).add(1)
            elif metric.kind == HISTOGRAM:
                meter.create_histogram(**args).record(1)
            else:
                raise AssertionError(f"metric kind {metric.kind!r} of {metric.name!r} not handled")
        text = generate_latest(registry).decode()
    finally:
        provider.shutdown()
    return frozenset(
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    )


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows only group them), nested rows included."""
    panels = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title and refId, expression)`` of every target of every panel."""
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"])
        for panel in query_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def load_alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERT_RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def guide_queries() -> list[str]:
    """The PromQL examples of docs/dashboards.md (its ```promql blocks, one query a line)."""
    blocks = re.findall(r"```promql\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


# ------------------------------------------------------------------------- the helpers


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('rl_host_memory_used_bytes{host_name=~"$host"}', {"rl_host_memory_used_bytes"}),
        (
            'sum by (rl_worker_group) (a_bytes{memory_type="pss"}) / on (x) b > 0.9',
            {"a_bytes", "b"},
        ),
        ('max_over_time(c[5m]) or vector(1e9) unless d{l="sum(e)"}', {"c", "d"}),
        ("count(f == 0) > bool 2", {"f"}),
    ],
)
def test_metric_names_finds_only_metrics(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_exported_names_come_from_the_exporter() -> None:
    names = exported_names()
    # Units become suffixes, dots underscores; an annotation unit ({process}) adds none.
    assert {"rl_host_memory_used_bytes", "rl_host_memory_total_bytes"} <= names
    assert {"gym_server_memory_usage_bytes", "gym_server_processes"} <= names
    assert {"rl_worker_group_memory_usage_bytes", "rl_worker_group_processes"} <= names
    assert "rl_host_memory_used" not in names
    assert "target_info" in names


# ------------------------------------------------------------------------- the dashboard


def test_dashboard_is_a_grafana_dashboard_on_a_prometheus_variable() -> None:
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    templating = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert templating["datasource"]["type"] == "datasource"
    assert templating["datasource"]["query"] == "prometheus"
    assert {"host", "worker_group"} <= set(templating)
    for panel in query_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_every_panel_has_a_query() -> None:
    panels = query_panels(load_dashboard())
    assert len(panels) >= 10
    for panel in panels:
        exprs = [target.get("expr", "").strip() for target in panel.get("targets", [])]
        assert exprs, f"panel {panel['title']!r} has no target"
        assert all(exprs), f"panel {panel['title']!r} has a target without a query"


def test_panel_ids_are_unique() -> None:
    dashboard = load_dashboard()
    ids = [panel["id"] for panel in dashboard["panels"]]
    ids += [panel["id"] for panel in query_panels(dashboard) if panel not in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_queries_use_only_exported_series() -> None:
    dashboard = load_dashboard()
    allowed = exported_names()
    queries = dashboard_queries(dashboard)
    queries += [
        (f"variable {v['name']}", variable_promql(v["query"]["query"]))
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - allowed
        assert not unknown, f"{where}: {sorted(unknown)} is not a series raylens exports"


def test_dashboard_covers_every_area() -> None:
    used = set().union(*(metric_names(expr) for _, expr in dashboard_queries(load_dashboard())))
    assert {
        "rl_host_memory_used_bytes",
        "rl_host_memory_total_bytes",
        "rl_worker_group_memory_usage_bytes",
        "rl_worker_group_processes",
        "gym_server_memory_usage_bytes",
        "gym_server_processes",
        "rl_host_scrape_up",
        "rl_host_scrape_duration_seconds",
        "rl_host_memory_growth_bytes_per_second",
        "rl_worker_group_memory_growth_bytes_per_second",
        "rl_host_memory_time_to_limit_seconds",
        "rl_host_memory_limit_bytes",
        "rl_worker_group_memory_phase_peak_bytes",
        "rl_worker_group_memory_phase_delta_bytes",
        "rl_host_oom_kills_total",
    } <= used


def test_phase_panels_follow_both_variables_and_name_the_phase_and_group() -> None:
    panels = [
        panel
        for panel in query_panels(load_dashboard())
        if any("phase_" in target["expr"] for target in panel["targets"])
    ]
    assert len(panels) >= 2
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            assert 'rl_worker_group=~"${worker_group}"' in expr, panel["title"]
            assert 'host_name=~"$host"' in expr, panel["title"]
            assert "rl_phase" in expr or "{{rl_phase}}" in target["legendFormat"], panel["title"]


# Node series carry the node's worker groups as one comma-separated label.
_NODE_GROUP_FILTER = 'rl_worker_groups=~"(.*,)?(${worker_group})(,.*)?"'


def test_growth_and_kill_line_panels_follow_the_worker_group_variable() -> None:
    panels = {panel["title"]: panel for panel in query_panels(load_dashboard())}
    for title in (
        "Memory growth per node",
        "Time to the kill line",
        "Memory used of the kill line per node",
    ):
        (target,) = panels[title]["targets"]
        selected = re.findall(r"\b[a-z_]+\{", target["expr"])  # each series read
        assert selected and target["expr"].count(_NODE_GROUP_FILTER) == len(selected), title
    (group,) = panels["Memory growth per worker group on each node"]["targets"]
    assert 'rl_worker_group=~"${worker_group}"' in group["expr"]


def test_dashboard_variables_are_defined() -> None:
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    for where, expr in dashboard_queries(dashboard):
        assert variables(expr) <= defined, f"{where}: undefined variable in {expr!r}"


def test_host_panels_never_sum_by_worker_group_label() -> None:
    # rl_worker_groups labels a whole-host figure; summing or averaging by it double-counts.
    for where, expr in dashboard_queries(load_dashboard()):
        assert not re.search(r"\b(?:sum|avg)\s+by\s*\([^)]*rl_worker_groups", expr), where


# ------------------------------------------------------------------------- the alert rules


def test_alert_rules_parse_and_name_exported_series() -> None:
    rules = {rule["alert"]: rule for rule in load_alert_rules()}
    assert set(rules) == {
        "RaylensNodeMemoryNearLimit",
        "RaylensServedProcessGone",
        "RaylensNodeReachesKillLineSoon",
        "RaylensWorkerKilledForMemory",
    }
    for name, rule in rules.items():
        assert metric_names(rule["expr"]) <= exported_names(), name
        assert rule["annotations"]["summary"], name
    near = rules["RaylensNodeMemoryNearLimit"]
    assert metric_names(near["expr"]) == {
        "rl_host_memory_used_bytes",
        "rl_host_memory_total_bytes",
    }
    assert near["expr"].rstrip().endswith("> 0.9")
    assert near["for"] == "5m"
    soon = rules["RaylensNodeReachesKillLineSoon"]
    assert metric_names(soon["expr"]) == {"rl_host_memory_time_to_limit_seconds"}
    assert soon["expr"].rstrip().endswith("< 1800")
    gone = rules["RaylensServedProcessGone"]
    assert metric_names(gone["expr"]) == {"gym_server_processes"}
    assert gone["expr"].rstrip().endswith("== 0")
    killed = rules["RaylensWorkerKilledForMemory"]
    assert metric_names(killed["expr"]) == {"rl_host_oom_kills_total"}
    assert "for" not in killed and killed["labels"]["severity"] == "critical"


_COUNT_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def test_the_guide_counts_the_alert_rules_and_describes_each() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    said = re.search(r"ships a Grafana dashboard and (\w+) Prometheus alert rules", guide)
    assert said is not None
    rules = load_alert_rules()
    assert _COUNT_WORDS[said.group(1)] == len(rules)
    files_row = next(line for line in guide.splitlines() if "raylens-alerts.yml)" in line)
    assert files_row.count(";") == len(rules) - 1, files_row


def test_the_guide_names_every_series_raylens_exports() -> None:
    table = GUIDE.read_text(encoding="utf-8").split("## How the names read in Prometheus", 1)[1]
    table = table.split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", table))
    missing = sorted(exported_names() - {"target_info"} - listed)
    assert not missing, f"the guide's name table leaves out {missing}"


# ------------------------------------------------------------------------- the guide


def test_guide_examples_use_only_exported_series() -> None:
    queries = guide_queries()
    assert len(queries) >= 5
    for expr in queries:
        unknown = metric_names(expr) - exported_names()
        assert not unknown, f"{expr!r} reads {sorted(unknown)}"


def test_readme_links_the_guide() -> None:
    assert "docs/dashboards.md" in README.read_text(encoding="utf-8")


# ------------------------------------------------------------------------- importing, variables


def test_the_import_asks_for_the_prometheus_data_source() -> None:
    dashboard = load_dashboard()
    (source,) = dashboard["__inputs"]
    assert source["type"] == "datasource" and source["pluginId"] == "prometheus"
    placeholder = "${" + source["name"] + "}"
    variable = {v["name"]: v for v in dashboard["templating"]["list"]}["datasource"]
    # Grafana replaces the placeholder with the data source picked at import.
    assert variable["current"]["value"] == placeholder
    required = {(item["type"], item["id"]) for item in dashboard["__requires"]}
    assert ("datasource", "prometheus") in required and ("grafana", "grafana") in required
    panel_types = {panel["type"] for panel in query_panels(dashboard)}
    assert panel_types <= {
        item["id"] for item in dashboard["__requires"] if item["type"] == "panel"
    }


def grafana_variable_values(regex: str, results: list[str]) -> list[str]:
    """The values Grafana lists for a query variable: every match of its /regex/g, in order.

    A regex with the ``g`` flag yields one value per match of its first group, and
    values repeat only once, as Grafana's variable editor does.
    """
    match = re.fullmatch(r"/(.*)/(\w*)", regex)
    assert match, f"variable regex {regex!r} is not /pattern/flags"
    pattern, flags = match.groups()
    found: list[str] = []
    for text in results:
        matches = re.findall(pattern, text)
        for value in matches if "g" in flags else matches[:1]:
            if value not in found:
                found.append(value)
    return found


def query_result_text(labels: dict[str, str], value: float = 1.0) -> str:
    """One result of a ``query_result()`` variable as Grafana writes it for the regex."""
    inner = ",".join(f'{key}="{label}"' for key, label in labels.items())
    return f"{{{inner}}} {value:g} 1700000000000"


def test_the_worker_group_variable_lists_groups_known_only_from_node_labels() -> None:
    variable = {v["name"]: v for v in load_dashboard()["templating"]["list"]}["worker_group"]
    query = variable["query"]["query"]
    assert query.startswith("query_result(") and query.endswith(")")
    names = metric_names(variable_promql(query))
    # Groups labelled on nodes (rl_worker_groups) and groups with measured processes.
    assert names == {"rl_host_memory_total_bytes", "rl_worker_group_processes"}
    # What Prometheus answers: one series per distinct label, node lists comma-joined.
    answer = [
        query_result_text({"rl_worker_groups": "policy,rollout"}, 2),
        query_result_text({"rl_worker_groups": "none"}, 1),
        query_result_text({"rl_worker_groups": "samplers"}, 1),
        query_result_text({"rl_worker_groups": "trainer"}, 3),
    ]
    assert grafana_variable_values(variable["regex"], answer) == [
        "policy",
        "rollout",
        "samplers",
        "trainer",
    ]


def test_node_memory_outside_groups_keeps_every_node_and_its_host() -> None:
    (panel,) = [p for p in query_panels(load_dashboard()) if p["title"].startswith("Node memory")]
    (target,) = panel["targets"]
    expr = target["expr"]
    # Nodes without a group's PSS are kept (as the whole of their memory)...
    assert re.search(r"\bor\b", expr), expr
    # ...and the result keeps the left side's host_name, which the legend shows.
    assert "group_left" in expr and "{{host_name}}" in target["legendFormat"]
