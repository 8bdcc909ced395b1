"""Both scrape engines offer what the monitor asks of an engine; only the helper prestarts."""

from __future__ import annotations

from raylens.telemetry.host_memory._helper_engine import HelperEngine
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
