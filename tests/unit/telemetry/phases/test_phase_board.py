"""The current phase shared through the cluster's key-value store, and hostile entries in it."""

from __future__ import annotations

import json
import logging

from raylens.telemetry.phases.board import (
    MAX_PHASE_ENTRY_BYTES,
    CurrentPhase,
    clear_current_phase,
    publish_current_phase,
    read_current_phases,
)
from raylens_fakes import FakeCluster


def test_a_published_phase_is_read_by_another_process_and_cleared():
    cluster = FakeCluster()
    driver = cluster.for_job("01000000")
    assert publish_current_phase(driver, "gen", 1234.5)
    watcher = cluster.for_job("02000000")
    assert read_current_phases(watcher) == [CurrentPhase("01000000", "gen", 1234.5)]
    assert clear_current_phase(driver)
    assert read_current_phases(watcher) == []


def test_a_dead_jobs_phase_is_not_shown():
    cluster = FakeCluster()
    publish_current_phase(cluster.for_job("01000000"), "gen", 1.0)
    cluster.end_job("01000000")
    assert read_current_phases(cluster.for_job("02000000")) == []


def test_hostile_entries_cost_only_themselves(caplog):
    cluster = FakeCluster()
    good = cluster.for_job("0a")
    publish_current_phase(good, "train", 5.0)
    hostile = {
        "0b": b"x" * (MAX_PHASE_ENTRY_BYTES + 1),
        "0c": b"[" * 500,
        "0d": json.dumps({"phase": "\x1b]0;owned\x07", "started_at": 1}).encode(),
        "0e": json.dumps({"phase": "gen", "started_at": "soon"}).encode(),
        "0f": json.dumps({"phase": "gen", "started_at": float("inf")}).encode(),
        "10": b"\xff\xfe",
        "11": json.dumps(["gen"]).encode(),
    }
    for job, raw in hostile.items():
        cluster.for_job(job).kv_put(f"phase/{job}", raw)
    with caplog.at_level(logging.WARNING, logger="raylens.phases"):
        phases = read_current_phases(cluster.for_job("99"))
    assert phases == [CurrentPhase("0a", "train", 5.0)]
    ignored = [r.getMessage() for r in caplog.records if "ignored the phase" in r.getMessage()]
    assert len(ignored) == len(hostile)
    assert not any("\x1b" in message for message in ignored)


def test_a_store_that_fails_is_warned_once_and_never_raises(caplog):
    cluster = FakeCluster()
    cluster.kv_error = ConnectionError("GCS gone")
    with caplog.at_level(logging.WARNING, logger="raylens.phases"):
        assert publish_current_phase(cluster, "gen", 1.0) is False
        assert read_current_phases(cluster) == []
        assert read_current_phases(cluster) == []
    assert len([r for r in caplog.records if "could not read" in r.getMessage()]) == 1


def test_nothing_is_published_without_a_connected_cluster():
    assert publish_current_phase(FakeCluster(initialized=False), "gen", 1.0) is False
    assert publish_current_phase(object(), "gen", 1.0) is False  # type: ignore[arg-type]


def test_stale_keys_of_ended_jobs_never_hide_a_live_phase_and_are_removed():
    from raylens.telemetry.phases.board import MAX_JOBS_READ

    cluster = FakeCluster()
    for index in range(MAX_JOBS_READ + 10):  # sorted before the live job's key
        job = f"00{index:06x}"
        publish_current_phase(cluster.for_job(job), "old", 1.0)
        cluster.end_job(job)
    publish_current_phase(cluster.for_job("ff000000"), "train", 2.0)
    watcher = cluster.for_job("ee000000")
    assert read_current_phases(watcher) == [CurrentPhase("ff000000", "train", 2.0)]
    # Every ended job's key is gone (a read removes at most MAX_JOBS_READ of them).
    read_current_phases(watcher)
    assert watcher.kv_keys("phase/") == ["phase/ff000000"]


def test_a_driver_killed_inside_a_phase_leaves_no_key_behind_after_the_next_read():
    cluster = FakeCluster()
    publish_current_phase(cluster.for_job("01000000"), "gen", 1.0)  # then killed: no clear
    cluster.end_job("01000000")
    watcher = cluster.for_job("02000000")
    assert read_current_phases(watcher) == []
    assert watcher.kv_keys("phase/") == []
