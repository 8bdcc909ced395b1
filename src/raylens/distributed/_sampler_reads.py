"""Asking every node's sampler for one reading under one deadline: ``sample()``.

The on-demand path of
:class:`~raylens.distributed.group_memory_sampler.GroupMemorySamplers`: each call
sends each node that has workers its list, waits for all answers together within
``timeout_s``, and turns each into a
:class:`~raylens.telemetry.group_memory.NodeGroupMemory` or a
:class:`~raylens.distributed._sampler_parts.SamplerError`; a sampler whose previous
request is still open is not asked again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from raylens.cluster import ray_call_errors
from raylens.distributed._sampler_fleet import _UNSETTLED, _SamplerFleet
from raylens.distributed._sampler_parts import SamplerError, _check_node_id, _describe
from raylens.safe_text import printable
from raylens.telemetry.group_memory import NodeGroupMemory, as_group_worker


class _SamplerReads(_SamplerFleet):
    """``sample()``: one reading per node, each or its error, within ``timeout_s``."""

    def sample(
        self, workers_by_node: Mapping[str, Iterable[tuple[str, int, int | None]]]
    ) -> dict[str, NodeGroupMemory | SamplerError]:
        """One reading per node that has workers, each or its error, within :attr:`timeout_s`.

        ``workers_by_node`` maps a node id to its ``(group, pid, start_ticks)``
        workers; a node with none, or missing, loses its sampler. Raises ValueError,
        naming it, for a malformed node id or worker, before anything is started.
        """
        wanted: dict[str, list[tuple[str, int, int | None]]] = {}
        for node_id, workers in workers_by_node.items():
            # Plain tuples: they travel to the node's sampler actor as its wire format.
            entries = [
                (checked.group, checked.pid, checked.start_ticks)
                for checked in map(as_group_worker, workers)
            ]
            if entries:
                wanted[_check_node_id(node_id)] = entries
        with self._lock:
            self._settled = _UNSETTLED
            return self._sample(wanted)

    def _sample(
        self, wanted: dict[str, list[tuple[str, int, int | None]]]
    ) -> dict[str, NodeGroupMemory | SamplerError]:
        deadline = time.monotonic() + self.timeout_s
        for node_id in [node for node in self._samplers if node not in wanted]:
            self._remove(node_id)
        if not wanted:
            return {}
        ray = self._ray_module()
        results: dict[str, NodeGroupMemory | SamplerError] = {}
        asked: dict[Any, str] = {}
        for node_id, workers in wanted.items():
            sampler = self._samplers.get(node_id)
            if sampler is None:
                try:
                    sampler = self._samplers[node_id] = self._start(node_id)
                except self._call_errors() as error:
                    results[node_id] = SamplerError(
                        node_id, f"could not start a sampler on node {node_id}: {_describe(error)}"
                    )
                    continue
            if sampler.pending is not None:
                done, _ = ray.wait([sampler.pending], num_returns=1, timeout=0)
                if not done:
                    results[node_id] = self._missed(
                        node_id, sampler, "its previous reading is still running"
                    )
                    continue
                sampler.pending = None  # a late answer describes an older cycle: dropped
            try:
                sampler.pending = sampler.actor.read.remote(workers)
            except ray_call_errors(ray) as error:
                self._remove(node_id)
                results[node_id] = SamplerError(
                    node_id, f"sampler on node {node_id} cannot be asked: {_describe(error)}"
                )
                continue
            asked[sampler.pending] = node_id
        if asked:
            refs = list(asked)
            ready, _ = ray.wait(
                refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic())
            )
            for ref in ready:
                node_id = asked.pop(ref)
                results[node_id] = self._collect(ray, node_id, ref, deadline)
            for node_id in asked.values():
                results[node_id] = self._missed(
                    node_id,
                    self._samplers[node_id],
                    f"no answer within the {self.timeout_s:g} s sampling timeout",
                )
        return {node: results[node] for node in wanted}

    def _collect(
        self, ray: Any, node_id: str, ref: Any, deadline: float
    ) -> NodeGroupMemory | SamplerError:
        sampler = self._samplers[node_id]
        sampler.pending = None
        try:
            plain = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.RayActorError as error:
            self._remove(node_id)  # started afresh next cycle
            return SamplerError(node_id, f"sampler on node {node_id} died: {_describe(error)}")
        except ray_call_errors(ray) as error:
            return SamplerError(node_id, f"sampler on node {node_id} failed: {_describe(error)}")
        sampler.missed = 0
        sampler.answered = True
        try:
            return NodeGroupMemory.from_plain(plain)
        except ValueError as error:
            return SamplerError(node_id, f"sampler on node {node_id}: {printable(error)}")
