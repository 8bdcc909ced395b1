"""Which scrape engine a host-memory monitor uses, and what it falls back to.

A monitor's :class:`ScrapeMode` comes from its argument, else from ``RAYLENS_SCRAPE_MODE``,
else the helper process. :class:`EngineChoice` makes the engine on first use (a
:class:`HelperEngine` or an in-process :class:`AsyncScrapeEngine`), tells it which samplers
to believe, and runs a cycle's batch through it: nodes in bad standing flagged for the wedged
lane, a replaced ``_scrape`` routed to its own threads, and a helper that breaks replaced,
for good, by the in-process engine.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Hashable, Mapping

from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.host_memory._cycle_records import _NEW, NodeKey, _Standing
from raylens.telemetry.host_memory._helper_engine import HelperEngine
from raylens.telemetry.host_memory._nodes import RayNode
from raylens.telemetry.host_memory._scrape_override import ScrapeOverride
from raylens.telemetry.names import LOGGER_NAME
from raylens.telemetry.scraping import (
    AsyncScrapeEngine,
    Outcome,
    ScrapeEngine,
    TrustingEngine,
)

__all__ = ["SCRAPE_MODE_ENV", "EngineChoice", "ScrapeMode"]

logger = logging.getLogger(LOGGER_NAME)

#: Environment variable that picks the scrape mode when none is passed.
SCRAPE_MODE_ENV = "RAYLENS_SCRAPE_MODE"


class ScrapeMode(enum.Enum):
    """Where scraping and parsing run."""

    #: In a helper process of its own; the driver only sends URLs and receives numbers.
    HELPER = "helper"
    #: On an event-loop thread of this process, for places where a child process is unwanted.
    INPROCESS = "inprocess"


def _scrape_mode(value: ScrapeMode | str | None) -> ScrapeMode:
    if isinstance(value, ScrapeMode):
        return value
    if value is None:
        raw = os.environ.get(SCRAPE_MODE_ENV, "")
        try:
            return ScrapeMode(raw.strip().lower()) if raw.strip() else ScrapeMode.HELPER
        except ValueError:
            warn_once(
                "host_memory.scrape_mode_env",
                f"{SCRAPE_MODE_ENV}={printable(repr(raw))} is not one of "
                f"{[m.value for m in ScrapeMode]}; scraping in a helper process",
                logger=logger,
            )
            return ScrapeMode.HELPER
    try:
        return ScrapeMode(value)
    except ValueError:
        raise ValueError(
            f"scrape_mode must be one of {[m.value for m in ScrapeMode]}, got {value!r}"
        ) from None


class EngineChoice(ScrapeOverride):
    """The engine side of :class:`~._monitor.HostMemoryMonitor`, as one of its bases.

    The attributes below are set by the monitor's constructor (``_lock`` anew after a fork).
    """

    scrape_mode: ScrapeMode
    scrape_timeout: float
    _engine: ScrapeEngine | None
    _trusted_samplers: Mapping[str, str] | None
    _standing: dict[NodeKey, tuple[_Standing, int]]

    @property
    def helper_pid(self) -> int | None:
        """The scrape helper's pid while one runs (helper mode), else None."""
        engine = self._engine
        return engine.pid if isinstance(engine, HelperEngine) else None

    def _run(self, order: list[RayNode]) -> dict[Hashable, Outcome]:
        standing = self._standing
        jobs = [
            (node.key, node.metrics_url, standing.get(node.key, _NEW)[0] is _Standing.WEDGED)
            for node in order
        ]
        if self._scrape_overridden():
            # Filled in place: the engine looks nodes up in this very dict.
            self._overridden_nodes.clear()
            self._overridden_nodes.update((node.key, node) for node in order)
            return self._override_engine().scrape(jobs, self.scrape_timeout)
        try:
            return self._engine_for_use().scrape(jobs, self.scrape_timeout)
        except Exception:  # whatever breaks the helper process, scraping goes on in this one
            if self.scrape_mode is not ScrapeMode.HELPER:
                raise
            warn_once(
                "host_memory.helper.failed",
                "the host-memory scrape helper could not run; scraping in this process instead",
                logger=logger,
            )
            self.scrape_mode = ScrapeMode.INPROCESS
            with self._lock:
                broken, self._engine = self._engine, None
            if broken is not None:
                broken.close(0.5)
            return self._engine_for_use().scrape(jobs, self.scrape_timeout)

    def _engine_for_use(self) -> ScrapeEngine:
        with self._lock:
            if self._engine is None:
                self._engine = (
                    HelperEngine(self.limits)
                    if self.scrape_mode is ScrapeMode.HELPER
                    else AsyncScrapeEngine(self.limits)
                )
                if self._trusted_samplers is not None and isinstance(self._engine, TrustingEngine):
                    self._engine.trust_samplers(self._trusted_samplers)
            return self._engine

    def trust_samplers(self, ids: Mapping[str, str] | None) -> None:
        """Believe, from the next scrape on, only the series of the samplers in ``ids``: the
        Ray actor ids of the samplers raylens started, each to the Ray worker id its series
        must carry (``""`` while not known); None, the default: any sampler's."""
        with self._lock:
            if ids is self._trusted_samplers:
                return  # the same mapping again: nothing to tell the engine
            self._trusted_samplers = ids
            engine = self._engine
        if isinstance(engine, TrustingEngine):
            engine.trust_samplers(ids)
