"""Keeping one publishing sampler per node without waiting on any: ``maintain()``.

The per-cycle path of
:class:`~raylens.distributed.group_memory_sampler.GroupMemorySamplers`: samplers
publish on their own timer, so a cycle only tells a node whose worker list changed,
starts a sampler where one is missing, asks one whose node has no worker left to mark
its groups gone, and every ``ping_every`` cycles sends liveness pings whose answers
(read the cycle after) replace a dead, silent or stuck sampler. Every Ray call made
here returns at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Hashable, Iterable, Mapping

from raylens.cluster import ray_call_errors
from raylens.distributed._sampler_fleet import _LOGGER, _UNSETTLED, _SamplerFleet
from raylens.distributed._sampler_parts import (
    SamplerError,
    _check_node_id,
    _describe,
    _Sampler,
    learn_worker,
    stuck_for,
)
from raylens.safe_text import printable
from raylens.telemetry.group_memory import as_group_worker


class _SamplerUpkeep(_SamplerFleet):
    """``maintain()``: samplers kept publishing, told only what changed, pinged in rounds."""

    def maintain(
        self,
        workers_by_node: Mapping[str, Iterable[tuple[str, int, int | None]]],
        *,
        version: Hashable | None = None,
        nodes: Collection[str] = (),
    ) -> dict[str, SamplerError]:
        """Keep one publishing sampler per node that has workers or is in ``nodes``, waiting
        on none of them.

        ``nodes`` are the nodes that keep a sampler even with no worker (the nodes the
        monitor scrapes: their sampler reads the node's memory and growth all the same).

        ``workers_by_node`` is as for :meth:`sample`. A node that gained workers gets a
        sampler, told its workers and started on a :attr:`sample_interval_s` timer (it
        then publishes through Ray's metrics pipeline, see
        :class:`GroupMemorySamplerActor`); a node whose list changed is told the new
        one, and only such a node; a node with no worker left has its sampler told to
        mark its groups gone (NaN) and killed at the first liveness round at least
        :data:`STOP_GRACE_S` later, once Ray has reported the NaN. Every :attr:`ping_every` cycles each sampler is pinged and the
        answers are read the cycle after: a dead sampler is replaced at once, one that
        has answered before is replaced after :attr:`max_missed` unanswered rounds, and
        one that never has is left to start for ``start_timeout_s``. Every Ray call made
        here returns at once, and a cycle in which nothing changed and no round falls
        makes none. Use either this or :meth:`sample` on one manager.

        ``version``, when given, names the content of ``workers_by_node`` and ``nodes``
        (the registry's version and the node list's, say): while it is the version of the last call after which
        every node's sampler stood told its list, and no sampler has been removed or
        failed to start since, the lists are not walked again; the liveness rounds
        run all the same, and a sampler they remove is started again the cycle after.

        Returns ``{node id: SamplerError}`` for the nodes with a problem this cycle,
        empty when all is well. Raises ValueError, naming it, for a malformed node id or
        worker, before anything is started or told.
        """
        present: set[str] = set()
        changed: dict[str, list[tuple[str, int, int | None]]] = {}
        with self._lock:
            if version is not None and version == self._settled:
                return self._maintain(None, changed)
            self._settled = _UNSETTLED
            everywhere = nodes if isinstance(nodes, (set, frozenset)) else set(nodes)
            for node_id, workers in workers_by_node.items():
                listed = workers if isinstance(workers, list) else list(workers)
                sampler = self._samplers.get(node_id)
                if sampler is not None and sampler.workers == listed:
                    present.add(node_id)  # the common case: one comparison, no validation
                    continue
                entries = [
                    (checked.group, checked.pid, checked.start_ticks)
                    for checked in map(as_group_worker, listed)
                ]
                if not entries and node_id not in everywhere:
                    continue
                present.add(_check_node_id(node_id))
                if sampler is None or sampler.workers != entries:
                    changed[node_id] = entries
            for node_id in everywhere:
                if node_id in workers_by_node:
                    continue
                sampler = self._samplers.get(node_id)
                present.add(node_id if sampler is not None else _check_node_id(node_id))
                if sampler is None or sampler.workers != []:
                    changed[node_id] = []
            # Settled unless telling a changed node fails or a sampler is removed below.
            self._settled = _UNSETTLED if version is None else version
            return self._maintain(present, changed)

    def _maintain(
        self, present: set[str] | None, changed: dict[str, list[tuple[str, int, int | None]]]
    ) -> dict[str, SamplerError]:
        """One cycle's work; ``present`` None when the worker lists were not walked."""
        self._cycle += 1
        results: dict[str, SamplerError] = {}
        if present is not None:
            # A sampler started early and never told workers is kept for the node's first.
            for node_id in [
                node
                for node, sampler in self._samplers.items()
                if node not in present and sampler.workers is not None
            ]:
                self._stop_sampler(node_id)
        for node_id, entries in changed.items():
            sampler = self._samplers.get(node_id)
            error: SamplerError | None = None
            if sampler is None:
                error = self._start_publishing(node_id, entries)
            elif (why := self._tell(sampler, entries, start=sampler.workers is None)) is not None:
                error = self._replace(
                    node_id,
                    f"sampler on node {node_id} cannot be reached: {why}; replaced",
                    entries,
                )
            if error is not None:
                self._settled = _UNSETTLED
                results[node_id] = error
        if self._pings_out and self._cycle > self._round:
            self._read_pings(results)
        if self._cycle - self._round >= self.ping_every:
            self._kill_stopping()
            self._send_pings(results)
            self._round = self._cycle
        return results

    def _tell(
        self, sampler: _Sampler, entries: list[tuple[str, int, int | None]], *, start: bool
    ) -> str | None:
        """Send a sampler its worker list (and start its timer); why it failed, or None."""
        try:
            sampler.actor.set_workers.remote(entries)
            if start:
                sampler.actor.start.remote(self.sample_interval_s)
        except self._call_errors() as error:
            return _describe(error)
        sampler.workers = entries
        if start:
            sampler.passes, sampler.advanced_at = None, self._clock()
        return None

    def _start_publishing(
        self, node_id: str, entries: list[tuple[str, int, int | None]]
    ) -> SamplerError | None:
        try:
            sampler = self._start(node_id)
        except self._call_errors() as error:
            return SamplerError(
                node_id, f"could not start a sampler on node {node_id}: {_describe(error)}"
            )
        self._samplers[node_id] = sampler
        why = self._tell(sampler, entries, start=True)
        if why is None:
            return None
        self._remove(node_id)  # started afresh next cycle
        return SamplerError(node_id, f"new sampler on node {node_id} cannot be reached: {why}")

    def _replace(
        self,
        node_id: str,
        message: str,
        entries: list[tuple[str, int, int | None]] | None = None,
    ) -> SamplerError:
        """Kill a node's sampler and start another now, told ``entries`` (default: the same)."""
        if entries is None:
            entries = self._samplers[node_id].workers
        self._remove(node_id)
        if entries is not None:
            error = self._start_publishing(node_id, entries)
            if error is not None:
                message = f"{message}; {error.message}"
        return SamplerError(node_id, message)

    def _stop_sampler(self, node_id: str) -> None:
        """Ask a sampler to mark its groups gone; it is killed at a round after the grace."""
        sampler = self._samplers.pop(node_id)
        self._ids_version += 1
        # One that cannot be asked is killed after the grace all the same.
        with contextlib.suppress(*ray_call_errors(self._ray)):
            sampler.actor.stop.remote(forget_groups=True)
        self._stopping.append((sampler.actor, self._clock()))

    def _send_pings(self, results: dict[str, SamplerError]) -> None:
        for node_id, sampler in list(self._samplers.items()):
            if sampler.ping is not None:
                self._pings_out = True  # the previous one is still out: read it next cycle
                continue
            try:
                sampler.ping = sampler.actor.ping.remote()
                if not sampler.worker_id and sampler.workers is not None:
                    sampler.asked_worker = sampler.actor.worker_id.remote()
            except self._call_errors() as error:
                results[node_id] = self._replace(
                    node_id,
                    f"sampler on node {node_id} cannot be reached: {_describe(error)}; replaced",
                )
                continue
            self._pings_out = True

    def _read_pings(self, results: dict[str, SamplerError]) -> None:
        self._pings_out = False
        pinged = {s.ping: node for node, s in self._samplers.items() if s.ping is not None}
        if not pinged:
            return
        ray = self._ray_module()
        ready, _ = ray.wait(list(pinged), num_returns=len(pinged), timeout=0)
        answered = set(ready)
        for ref, node_id in pinged.items():
            sampler = self._samplers[node_id]
            if ref not in answered:
                results[node_id] = self._missed(
                    node_id, sampler, "it has not answered its ping", "liveness checks"
                )
                if node_id not in self._samplers and sampler.workers is not None:  # start another
                    error = self._start_publishing(node_id, sampler.workers)
                    if error is not None:
                        message = f"{results[node_id].message}; {error.message}"
                        results[node_id] = SamplerError(node_id, message)
                continue
            sampler.ping = None
            try:
                passes = ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError as error:
                why = _describe(error)
                results[node_id] = self._replace(
                    node_id, f"sampler on node {node_id} died: {why}; replaced"
                )
                _LOGGER.warning(
                    "raylens: the memory sampler on node %s was killed (%s); started again",
                    printable(node_id[:64]),
                    why[:160],
                )
                continue
            except ray_call_errors(ray) as error:  # it answered, so it lives; say what went wrong
                results[node_id] = SamplerError(
                    node_id, f"sampler on node {node_id} failed its ping: {_describe(error)}"
                )
            else:
                if not sampler.worker_id:
                    learn_worker(ray, sampler)
                    self._ids_version += bool(sampler.worker_id)
                stuck = stuck_for(sampler, passes, self._clock(), self.sample_interval_s)
                if stuck is not None:
                    results[node_id] = self._replace(
                        node_id,
                        f"sampler on node {node_id} answers its pings but has published no "
                        f"reading for {stuck:.0f} s; replaced",
                    )
                    continue
            sampler.answered = True
            sampler.missed = 0
