"""The kill line is min(host, cgroup) x Ray's threshold; time to it only while growing."""

from __future__ import annotations

import math

import pytest

from raylens.telemetry.growth import KillLineConfig, kill_line, resolve_kill_line_config
from raylens.telemetry.growth._limit import RAY_THRESHOLD_ENV, THRESHOLD_ENV, time_to_limit

GIB = float(1 << 30)


def test_line_is_the_smaller_total_times_the_threshold() -> None:
    assert kill_line(64 * GIB) == pytest.approx(0.95 * 64 * GIB)
    assert kill_line(64 * GIB, 16 * GIB) == pytest.approx(0.95 * 16 * GIB)
    assert kill_line(64 * GIB, 16 * GIB, threshold=0.5) == pytest.approx(8 * GIB)


def test_an_unlimited_container_does_not_raise_the_line() -> None:
    # cgroup v1 reports "no limit" as a huge number.
    assert kill_line(64 * GIB, 2.0**63) == pytest.approx(0.95 * 64 * GIB)


@pytest.mark.parametrize("bad", [None, 0.0, -1.0, math.nan, math.inf])
def test_a_missing_or_unusable_total_is_left_out(bad: float | None) -> None:
    assert kill_line(bad, 8 * GIB) == pytest.approx(0.95 * 8 * GIB)
    assert kill_line(8 * GIB, bad) == pytest.approx(0.95 * 8 * GIB)
    assert kill_line(bad, bad) is None


def test_min_free_bytes_raises_the_line_when_higher_as_ray_does() -> None:
    assert kill_line(64 * GIB, min_free_bytes=1 * GIB) == pytest.approx(63 * GIB)
    assert kill_line(64 * GIB, min_free_bytes=10 * GIB) == pytest.approx(0.95 * 64 * GIB)


def test_time_to_limit_only_while_growing_and_rising() -> None:
    assert time_to_limit(100.0, 40.0, 2.0, True) == pytest.approx(30.0)
    assert time_to_limit(100.0, 40.0, 2.0, False) is None
    assert time_to_limit(100.0, 40.0, 0.0, True) is None
    assert time_to_limit(100.0, 40.0, -1.0, True) is None
    assert time_to_limit(None, 40.0, 2.0, True) is None
    assert time_to_limit(100.0, None, 2.0, True) is None
    assert time_to_limit(100.0, 40.0, None, True) is None
    assert time_to_limit(100.0, 140.0, 2.0, True) == 0.0


def test_threshold_defaults_to_rays() -> None:
    config = resolve_kill_line_config(env={})
    assert (config.threshold, config.source, config.monitor, config.min_free_bytes) == (
        0.95,
        "Ray's default",
        True,
        None,
    )


def test_threshold_sources_in_order() -> None:
    cluster = {"memory_usage_threshold": 0.8}
    env = {RAY_THRESHOLD_ENV: "0.7", THRESHOLD_ENV: "0.6"}
    assert resolve_kill_line_config(threshold=0.5, system_config=cluster, env=env).threshold == 0.5
    assert resolve_kill_line_config(system_config=cluster, env=env).threshold == 0.6
    config = resolve_kill_line_config(system_config=cluster, env={RAY_THRESHOLD_ENV: "0.7"})
    assert (config.threshold, config.source) == (0.8, "the cluster's system config")
    config = resolve_kill_line_config(system_config={}, env={RAY_THRESHOLD_ENV: "0.7"})
    assert config.threshold == 0.7
    assert RAY_THRESHOLD_ENV in config.source


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.1, math.nan, True, "x"])
def test_a_bad_threshold_given_to_raylens_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="threshold must be a number above 0 and at most 1"):
        resolve_kill_line_config(threshold=bad, env={})  # type: ignore[arg-type]


def test_a_bad_raylens_variable_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=f"{THRESHOLD_ENV}='1.2'.*above 0 and at most 1"):
        resolve_kill_line_config(env={THRESHOLD_ENV: "1.2"})


def test_bad_cluster_values_are_skipped_and_listed_printably() -> None:
    config = resolve_kill_line_config(
        system_config={"memory_usage_threshold": "\x1b[2Jnope", "min_memory_free_bytes": "lots"},
        env={RAY_THRESHOLD_ENV: "0.9"},
    )
    assert config.threshold == 0.9
    assert len(config.ignored) == 2
    assert all("\x1b" not in note for note in config.ignored)
    assert any("memory_usage_threshold" in note for note in config.ignored)


def test_a_switched_off_monitor_moves_the_line_to_the_total() -> None:
    config = resolve_kill_line_config(system_config={"memory_monitor_refresh_ms": 0}, env={})
    assert config.monitor is False
    assert config.limit(64 * GIB, 32 * GIB) == pytest.approx(32 * GIB)


def test_config_limit_applies_min_free_bytes_from_the_cluster() -> None:
    config = resolve_kill_line_config(system_config={"min_memory_free_bytes": 1 << 30}, env={})
    assert config.limit(64 * GIB) == pytest.approx(63 * GIB)
    assert KillLineConfig().limit(None) is None
