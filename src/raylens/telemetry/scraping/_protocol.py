"""What the host-memory monitor asks of a scrape engine.

Two engines exist: the helper process (:class:`~raylens.telemetry.host_memory._helper_engine.HelperEngine`)
and the in-process one (:class:`~raylens.telemetry.scraping._engine.AsyncScrapeEngine`); the
monitor builds one of them from its ``scrape_mode``. :class:`ScrapeEngine` is what both offer;
:class:`PrestartingEngine` adds what only an engine that runs in another process has: a way to
start that process ahead of the first batch, and its pid.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from raylens.telemetry.scraping._engine import Job, Outcome

__all__ = ["PrestartingEngine", "ScrapeEngine", "TrustingEngine"]


@runtime_checkable
class ScrapeEngine(Protocol):
    """Scrapes batches of nodes and can be closed; safe to call from any thread."""

    def scrape(
        self, jobs: Sequence[Job], timeout: float | None = None, /
    ) -> dict[Hashable, Outcome]:
        """Scrape every ``(key, url, wedged)`` of ``jobs`` once and return what came back.

        Returns within ``timeout`` (the engine's own when None) plus a little; a key
        missing from the result did not answer in time.
        """
        ...

    def close(self, timeout: float = 1.0, /) -> None:
        """End every request and whatever the engine runs, waiting at most ``timeout`` seconds."""
        ...


@runtime_checkable
class PrestartingEngine(ScrapeEngine, Protocol):
    """A :class:`ScrapeEngine` that runs in a process of its own."""

    @property
    def pid(self) -> int | None:
        """The engine's process id while that process runs, else None."""
        ...

    def prestart(self) -> None:
        """Start the engine's process now, without waiting for it to be ready."""
        ...


@runtime_checkable
class TrustingEngine(Protocol):
    """An engine that can be told whose sampler series to believe."""

    def trust_samplers(self, ids: Mapping[str, str] | None, /) -> None:
        """Believe only the series of the samplers in ``ids`` from the next batch (None: any)."""
        ...
