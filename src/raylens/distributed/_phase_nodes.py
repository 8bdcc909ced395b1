"""Where a phase's boundaries reach beyond the driver: every node's group-memory sampler.

:class:`SamplerPhaseNodes` tells each node's sampler that a phase began and collects its
figures at the end, waiting on every node together, each wait bounded by the caller's
timeout. Used by :mod:`raylens.distributed.phases` (which re-exports both names).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from raylens.cluster import ray_call_errors
from raylens.distributed.group_memory_cycle import default_group_memory_cycle
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import DEFAULT_WORKER_REGISTRY, GroupWorkerRegistry
from raylens.telemetry.phases.memory import NodePhaseMemory

__all__ = ["PhaseNodes", "SamplerPhaseNodes"]

logger = logging.getLogger("raylens.phases")


class PhaseNodes(Protocol):
    """Where a phase's boundaries reach beyond the driver: every node's sampler."""

    def begin(self, token: str, kernel_peaks: bool, timeout_s: float) -> tuple[set[str], list[str]]:
        """Tell every node the phase ``token`` began; ``(confirmed, not confirmed)`` node ids."""

    def end(self, token: str, timeout_s: float) -> tuple[dict[str, NodePhaseMemory], list[str]]:
        """Every node's figures of phase ``token``, and the nodes that gave none."""


def _default_samplers() -> Any:
    return default_group_memory_cycle().samplers


class SamplerPhaseNodes:
    """Phase boundaries on the group-memory samplers (one per node that hosts workers).

    ``samplers`` is a :class:`~raylens.distributed.group_memory_sampler.GroupMemorySamplers`
    or a callable returning one (default: the driver's, made on first use); ``registry``
    (default the process-wide one) says which workers each node has.
    """

    def __init__(
        self,
        samplers: Any = None,
        *,
        registry: GroupWorkerRegistry | None = None,
    ) -> None:
        self._samplers = samplers
        self._registry = registry if registry is not None else DEFAULT_WORKER_REGISTRY
        # The phase being measured: its token and the actors told it began.
        self._begun: tuple[str, Any, dict[str, Any]] | None = None

    def _manager(self) -> Any:
        if self._samplers is None:
            return _default_samplers()
        return self._samplers() if callable(self._samplers) else self._samplers

    def begin(self, token: str, kernel_peaks: bool, timeout_s: float) -> tuple[set[str], list[str]]:
        self._begun = None
        workers = self._registry.workers_by_node()
        if not workers:
            return set(), []
        ray, actors = self._manager().sampler_actors()
        if not actors:
            warn_once(
                "phases.no_samplers",
                "worker groups are registered but no group-memory sampler runs (start "
                "telemetry with raylens.driver.init_telemetry_driver): phases measure the "
                "driver group only (warned once)",
                logger=logger,
            )
            return set(), []
        missing = sorted(node for node in workers if node not in actors)
        told = {node: actors[node] for node in workers if node in actors}
        self._begun = (token, ray, told)
        answers, unanswered = _gather(
            ray,
            {
                node: (actor, "phase_begin", (token, workers[node], kernel_peaks))
                for node, actor in told.items()
            },
            timeout_s,
        )
        confirmed = {node for node, answer in answers.items() if answer is True}
        return confirmed, sorted([*missing, *unanswered, *(set(answers) - confirmed)])

    def end(self, token: str, timeout_s: float) -> tuple[dict[str, NodePhaseMemory], list[str]]:
        begun, self._begun = self._begun, None
        if begun is None or begun[0] != token:
            return {}, []
        _, ray, told = begun
        answers, missing = _gather(
            ray,
            {node: (actor, "phase_end", (token,)) for node, actor in told.items()},
            timeout_s,
        )
        figures: dict[str, NodePhaseMemory] = {}
        for node_id, plain in answers.items():
            try:
                if isinstance(plain, BaseException):
                    raise plain
                if plain is None:
                    raise ValueError("the phase had not begun there")
                figures[node_id] = NodePhaseMemory.from_plain(plain)
            except ray_call_errors(ray) as error:  # what _gather caught, or a malformed report
                warn_once(
                    "phases.node_figures",
                    f"node {printable(node_id[:56])} gave no phase figures "
                    f"({type(error).__name__}: {printable(error)[:200]}); warned once",
                    logger=logger,
                )
                missing.append(node_id)
        return figures, sorted(missing)


def _gather(
    ray: Any, calls: Mapping[str, tuple[Any, str, tuple[Any, ...]]], timeout_s: float
) -> tuple[dict[str, Any], list[str]]:
    """Call every node's ``(actor, method, args)``, and wait for them all together at most
    ``timeout_s``.

    Returns ``({node: answer or the exception it raised}, [nodes with no answer in time,
    or whose call could not be made]``.
    """
    asked: dict[Any, str] = {}
    unanswered: list[str] = []
    for node_id, (actor, method, args) in calls.items():
        try:
            asked[getattr(actor, method).remote(*args)] = node_id
        except ray_call_errors(ray):
            unanswered.append(node_id)
    answers: dict[str, Any] = {}
    if asked:
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=timeout_s)
        for ref in ready:
            node_id = asked.pop(ref)
            try:
                answers[node_id] = ray.get(ref, timeout=0)
            except ray_call_errors(ray) as error:
                answers[node_id] = error
        unanswered.extend(asked.values())
    return answers, unanswered
