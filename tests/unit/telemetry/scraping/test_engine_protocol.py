"""Both scrape engines offer what the monitor asks of an engine; only the helper prestarts."""

from __future__ import annotations

from raylens.telemetry.host_memory._helper_engine import HelperEngine
from raylens.telemetry.host_memory._threaded_scrapes import ThreadedScrapes
from raylens.telemetry.scraping import (
    AsyncScrapeEngine,
    PrestartingEngine,
    ScrapeEngine,
    ScrapeLimits,
)


def test_the_in_process_engine_scrapes_and_closes_but_has_no_process() -> None:
    engine = AsyncScrapeEngine(ScrapeLimits(timeout=5.0))
    try:
        assert isinstance(engine, ScrapeEngine)
        assert not isinstance(engine, PrestartingEngine)
    finally:
        engine.close(0.0)


def test_the_helper_engine_also_prestarts_and_has_a_pid() -> None:
    engine = HelperEngine(ScrapeLimits(timeout=5.0))  # no process until asked
    try:
        assert isinstance(engine, PrestartingEngine)
        assert engine.pid is None
    finally:
        engine.close(0.0)


def test_a_stand_in_needs_only_scrape_and_close() -> None:
    class StandIn:
        def scrape(self, jobs: object, timeout: float | None = None) -> dict[object, object]:
            return {}

        def close(self, timeout: float = 1.0) -> None:
            pass

    assert isinstance(StandIn(), ScrapeEngine)
    assert not isinstance(StandIn(), PrestartingEngine)


def test_the_engine_that_runs_a_replaced_scrape_is_a_scrape_engine_too() -> None:
    nodes = {"a": "node-a", "b": "node-b"}
    engine = ThreadedScrapes(2, nodes.__getitem__, lambda node: {"used": float(len(node))})
    try:
        assert isinstance(engine, ScrapeEngine)
        assert not isinstance(engine, PrestartingEngine)
        results = engine.scrape([("a", "http://unused", False), ("b", "http://unused", False)], 5.0)
        assert {key: outcome.values for key, outcome in results.items()} == {
            "a": {"used": 6.0},
            "b": {"used": 6.0},
        }
    finally:
        engine.close(1.0)
