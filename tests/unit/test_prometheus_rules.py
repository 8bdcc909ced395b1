"""The shipped rules over Ray's series (docs/prometheus/raylens-ray-rules.yml).

``promtool test rules`` runs the rules' own unit tests (slow tier: a real process); the
fast tier checks that every series the rules read is one raylens or Ray publishes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from raylens.telemetry.raylet_payload import (
    GROUP_LABEL,
    NODE_SERIES,
    RAY_GROUP_GROWTH,
    RAY_GROUP_MEMORY,
    RAY_NODE_MEM_USED,
    RAY_SAMPLER_SAMPLED_AT,
    RAY_WORKER_EVICTIONS,
)

RULES_DIR = Path(__file__).resolve().parents[2] / "docs" / "prometheus"
RULES = RULES_DIR / "raylens-ray-rules.yml"
RULE_TESTS = RULES_DIR / "raylens-ray-rules.test.yml"

#: Series the driver's own exporter publishes, which the phase rules read.
EXPORTED = {"rl_worker_group_memory_phase_peak_bytes", "rl_host_memory_total_bytes"}
KNOWN = {
    *NODE_SERIES,
    RAY_GROUP_GROWTH,
    RAY_GROUP_MEMORY,
    RAY_NODE_MEM_USED,
    RAY_SAMPLER_SAMPLED_AT,
    RAY_WORKER_EVICTIONS,
    *EXPORTED,
}
_NAME = re.compile(r"(?<![:\w])((?:ray|rl)_[a-z_]+)\b")


def _rules() -> list[dict[str, str]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_series_the_rules_read_is_published() -> None:
    rules = _rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    for rule in rules:
        for name in _NAME.findall(rule["expr"]):
            if name not in (GROUP_LABEL, "rl_phase", "ray_node_id"):
                assert name in KNOWN, (rule.get("record") or rule.get("alert"), name)
        for name in re.findall(r"raylens:[a-z_:0-9]+", rule["expr"]):
            assert name in recorded, name


def test_the_rules_cover_growth_time_to_limit_phases_kills_and_missing_samplers() -> None:
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert {
        "RaylensWorkerGroupReachesKillLineSoon",
        "RaylensNodeReachesKillLineSoon",
        "RaylensWorkerKilledForMemory",
        "RaylensSamplerMissing",
        "RaylensPhasePeakNearNodeTotal",
    } <= alerts


@pytest.mark.slow
def test_promtool_passes_the_rules_own_unit_tests(
    promtool_test_rules: Callable[..., None],
) -> None:
    promtool_test_rules(RULE_TESTS)
