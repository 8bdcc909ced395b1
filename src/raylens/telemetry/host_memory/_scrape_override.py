"""The per-node ``_scrape`` seam of a host-memory monitor, and the engine that honours it.

:meth:`ScrapeOverride._scrape` fetches one node in this process. A subclass or a test that
replaces it (on the class or on one monitor) turns every cycle of that monitor over to
:class:`ThreadedScrapes`, which calls the replacement for each node on a bounded pool of
threads instead of handing the nodes to the helper or in-process engine. This module owns
that switch: whether ``_scrape`` was replaced, the pool, and the table of the cycle's nodes
the pool looks its jobs up in.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from raylens.telemetry.host_memory._nodes import RayNode
from raylens.telemetry.host_memory._threaded_scrapes import ThreadedScrapes
from raylens.telemetry.scraping import ScrapeEngine, ScrapeLimits, fetch_once

__all__ = ["ScrapeOverride"]

#: Most threads that call a replaced ``_scrape`` at once (fewer when ``max_concurrency`` is).
_OVERRIDE_THREADS = 32


class ScrapeOverride:
    """The ``_scrape`` seam of :class:`~._monitor.HostMemoryMonitor`, as one of its bases.

    The attributes below are set by the monitor's constructor (``_lock`` and ``_threads``
    anew after a fork).
    """

    limits: ScrapeLimits
    max_concurrency: int
    _lock: threading.Lock
    _threads: ThreadedScrapes[RayNode] | None
    #: The nodes of the cycle in progress, by key, for a replaced ``_scrape``.
    _overridden_nodes: dict[Hashable, RayNode]

    def _scrape(self, node: RayNode) -> dict[str, float]:
        """Fetch and parse one node's memory series now; ``{}`` when that fails.

        The per-node seam: a subclass or a test that replaces this method changes
        what every cycle fetches (the cycle then calls it in this process). A
        failure is not retried: the next cycle is the retry.
        """
        return dict(fetch_once(node.metrics_url, self.limits).values or {})

    def _scrape_overridden(self) -> bool:
        return "_scrape" in vars(self) or type(self)._scrape is not _DEFAULT_SCRAPE

    def _override_engine(self) -> ScrapeEngine:
        """The engine that calls the replaced ``_scrape`` of each node, in this process."""
        with self._lock:
            if self._threads is None:
                self._threads = ThreadedScrapes(
                    min(self.max_concurrency, _OVERRIDE_THREADS),
                    self._overridden_node,
                    self._scrape,
                )
            return self._threads

    def _overridden_node(self, key: Hashable) -> RayNode:
        """The node of ``key`` in the cycle in progress (the table is replaced every cycle)."""
        return self._overridden_nodes[key]


_DEFAULT_SCRAPE = ScrapeOverride._scrape
