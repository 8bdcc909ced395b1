"""The registry of the samplers raylens started, in the cluster's key-value store (FakeCluster)."""

from __future__ import annotations

import json
import logging

import pytest

from raylens.telemetry.sampler_registry import (
    MAX_ENTRY_BYTES,
    SAMPLER_KEY_PREFIX,
    SamplerRegistry,
)
from raylens_fakes import FakeCluster
from raylens_fakes.clock import ManualClock


def test_a_driver_lists_its_samplers_and_another_process_learns_them() -> None:
    cluster = FakeCluster()
    driver = SamplerRegistry(cluster.for_job("02000000"))
    driver.started({"a" * 32: "wa", "b" * 32: ""})
    assert driver.publish()
    assert json.loads(cluster.kv_get(f"{SAMPLER_KEY_PREFIX}02000000") or b"") == {
        "a" * 32: "wa",
        "b" * 32: "",
    }

    watch = SamplerRegistry(cluster)
    assert watch.trusted() == {"a" * 32: "wa", "b" * 32: ""}
    assert watch.own == {}


def test_a_worker_id_once_known_stays() -> None:
    registry = SamplerRegistry(FakeCluster())
    registry.started({"a" * 32: ""})
    registry.started({"a" * 32: "wa"})
    registry.started({"a" * 32: ""})  # stopping: its worker id no longer at hand
    assert registry.own == {"a" * 32: "wa"}


def test_an_ended_jobs_entry_and_a_malformed_one_are_not_believed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeCluster()
    ended = SamplerRegistry(cluster.for_job("02000000"))
    ended.started({"e" * 32: ""})
    ended.publish()
    cluster.end_job("02000000")
    cluster.for_job("03000000").kv_put(f"{SAMPLER_KEY_PREFIX}03000000", b'{"a": {"nested": ""}}')
    cluster.for_job("04000000").kv_put(
        f"{SAMPLER_KEY_PREFIX}04000000", b"{" + b" " * MAX_ENTRY_BYTES + b"}"
    )
    cluster.for_job("05000000").kv_put(f"{SAMPLER_KEY_PREFIX}05000000", b'{"ok": ""}')

    with caplog.at_level(logging.WARNING, logger="raylens"):
        assert SamplerRegistry(cluster).trusted() == {"ok": ""}

    warned = " ".join(record.getMessage() for record in caplog.records)
    assert "sampler/03000000" in warned and "sampler/04000000" in warned


def test_an_unreachable_store_leaves_this_process_s_own_samplers_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeCluster()
    other = SamplerRegistry(cluster.for_job("02000000"))
    other.started({"o" * 32: ""})
    other.publish()
    clock = ManualClock(100.0)
    registry = SamplerRegistry(cluster, clock=clock, refresh_s=30.0)
    registry.started({"m" * 32: ""})
    cluster.kv_error = ConnectionError("GCS unreachable")

    with caplog.at_level(logging.WARNING, logger="raylens"):
        assert registry.trusted() == {"m" * 32: ""}
        clock.now += 30.0
        assert registry.trusted() == {"m" * 32: ""}
        assert not registry.publish()

    read_warnings = [r for r in caplog.records if "could not read the samplers" in r.getMessage()]
    assert len(read_warnings) == 1
    assert "only the series of samplers this process started" in read_warnings[0].getMessage()

    cluster.kv_error = None
    clock.now += 30.0
    assert registry.trusted() == {"m" * 32: "", "o" * 32: ""}


def test_the_entries_are_read_again_only_after_the_refresh_time() -> None:
    cluster = FakeCluster()
    clock = ManualClock(100.0)
    watch = SamplerRegistry(cluster, clock=clock, refresh_s=30.0)
    assert watch.trusted() == {}
    later = SamplerRegistry(cluster.for_job("02000000"))
    later.started({"n" * 32: ""})
    later.publish()

    clock.now += 29.0
    assert watch.trusted() == {}
    clock.now += 1.0
    assert watch.trusted() == {"n" * 32: ""}
