"""Scripted OOM kills on a simulated cluster: both kill counters, over simulated time.

A :class:`KillScript` lists kills as ``(node index, t, killer)`` or ``(node index, t,
killer, victim name)``: ``"ray"`` increments the node's raylet eviction counter
(``ray_memory_manager_worker_eviction_total``, as Ray 2.60's memory monitor does: one
series per victim ``Name``, labelled as the raylet's own, and absent until the node's
first kill), ``"kernel"`` the kernel OOM-kill count its sampler publishes. :meth:`KillScript.series` writes both as the node's endpoint serves them,
so a scrape of a simulated raylet, or a test feeding the payload parser, reads kills
exactly as from a real cluster. ``same_machine`` nodes share one kernel count, as
raylets of one machine do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from raylens.telemetry.oom import SOURCE_VMSTAT, Killer
from raylens.telemetry.raylet_payload import (
    COMPONENT_LABEL,
    EVICTION_NAME_LABEL,
    OOM_SOURCE_LABEL,
    RAY_NODE_OOM_KILLS,
    RAY_WORKER_EVICTIONS,
    RAY_WORKER_ID_LABEL,
    RAYLET_COMPONENT,
)

__all__ = ["DEFAULT_VICTIM", "KillScript", "ScriptedKill"]

#: The ``Name`` a scripted Ray kill's victim has when the script names none.
DEFAULT_VICTIM = "MemoryWorker"


class ScriptedKill(NamedTuple):
    """One kill: on node ``node`` at ``t`` seconds of simulated time, by ``killer``."""

    node: int
    t: float
    killer: Killer
    #: The victim's ``Name`` on Ray's counter (Ray's kills only).
    victim: str = DEFAULT_VICTIM


class KillScript:
    """Kills over simulated time; see the module docstring.

    ``same_machine`` lists groups of node indices that share one machine (one kernel
    count); a kernel kill on any of them raises the count all of them report.
    """

    def __init__(
        self,
        kills: Iterable[
            tuple[int, float, Killer | str] | tuple[int, float, Killer | str, str]
        ] = (),
        *,
        same_machine: Sequence[Sequence[int]] = (),
    ) -> None:
        self.kills: list[ScriptedKill] = []
        for node, t, killer, *named in kills:
            if isinstance(node, bool) or not isinstance(node, int) or node < 0:
                raise ValueError(f"a kill's node must be an index (int >= 0), got {node!r}")
            try:
                who = Killer(killer)
            except ValueError:
                raise ValueError(
                    f"a kill's killer must be 'ray' or 'kernel', got {killer!r:.40}"
                ) from None
            victim = str(named[0]) if named else DEFAULT_VICTIM
            self.kills.append(ScriptedKill(node, float(t), who, victim))
        self._machine = {n: tuple(group) for group in same_machine for n in group}

    def add(self, node: int, t: float, killer: Killer | str, victim: str = DEFAULT_VICTIM) -> None:
        """Script one more kill."""
        self.kills.extend(KillScript([(node, t, killer, victim)]).kills)

    def counts(self, node: int, t: float) -> tuple[int, int]:
        """``(Ray's eviction counter, the kernel's count)`` node ``node`` reports at ``t``."""
        machine = self._machine.get(node, (node,))
        ray = sum(1 for k in self.kills if k.node == node and k.t <= t and k.killer is Killer.RAY)
        kernel = sum(
            1 for k in self.kills if k.node in machine and k.t <= t and k.killer is Killer.KERNEL
        )
        return ray, kernel

    def series(self, node: int, t: float, *, worker_id: str | None = None) -> bytes:
        """Both counters as node ``node``'s endpoint serves them at ``t``."""
        _, kernel = self.counts(node, t)
        worker = worker_id or f"{node:056x}"
        by_victim: dict[str, int] = {}
        for kill in self.kills:
            if kill.node == node and kill.t <= t and kill.killer is Killer.RAY:
                by_victim[kill.victim] = by_victim.get(kill.victim, 0) + 1
        lines = [f"# TYPE {RAY_WORKER_EVICTIONS} counter"] if by_victim else []
        lines += [
            f'{RAY_WORKER_EVICTIONS}{{{COMPONENT_LABEL}="{RAYLET_COMPONENT}",'
            f'{EVICTION_NAME_LABEL}="{_escaped(victim)}",'
            f'Type="MemoryManager.ActorEviction.Total",{RAY_WORKER_ID_LABEL}=""}} {float(n)!r}'
            for victim, n in sorted(by_victim.items())
        ]
        lines += [
            f"# TYPE {RAY_NODE_OOM_KILLS} gauge",
            f'{RAY_NODE_OOM_KILLS}{{{RAY_WORKER_ID_LABEL}="{worker}",'
            f'{OOM_SOURCE_LABEL}="{SOURCE_VMSTAT}"}} {float(kernel)!r}',
        ]
        return ("\n".join(lines) + "\n").encode("utf-8")


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
