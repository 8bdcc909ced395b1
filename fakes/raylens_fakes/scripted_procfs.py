"""A node's worker groups in a :class:`FakeProcFS`, holding what a memory script says, on simulated time.

:class:`ScriptedProcesses` gives each worker group a node of a
:class:`~raylens.simulation.memory_script.MemoryScript` scripts one process in a fake
``/proc``. :meth:`ScriptedProcesses.advance` moves simulated time on: each process's RSS
becomes the script's value then, and its high-water mark (``VmHWM``) rises to the most
the script held in between, as the kernel's does. A spike that starts and ends between
two samples (a :class:`~raylens.simulation.memory_script.Pulse`) is thus visible to the
kernel's mark and invisible to every RSS sample.
"""

from __future__ import annotations

from raylens.simulation.memory_script import MemoryScript
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

__all__ = ["ScriptedProcesses"]


def _pages(value: float) -> int:
    return max(0, int(value) // PAGE_SIZE * PAGE_SIZE)


class ScriptedProcesses:
    """One process per group of ``node`` in ``script``, in ``fake``, from pid ``first_pid`` on.

    Time starts at ``start`` seconds of the script; ``resolution`` is how finely the
    marks follow the script between two :meth:`advance` calls.
    """

    def __init__(
        self,
        fake: FakeProcFS,
        script: MemoryScript,
        node: int,
        *,
        first_pid: int = 1000,
        start: float = 0.0,
        resolution: float = 0.001,
    ) -> None:
        self.fake = fake
        self.script = script
        self.node = node
        self.resolution = resolution
        self.t = float(start)
        self.pids: dict[str, int] = {}
        for offset, group in enumerate(script.group_names(node)):
            pid = first_pid + offset
            fake.add_process(pid, rss_bytes=_pages(self._value(group, self.t)))
            self.pids[group] = pid

    def _value(self, group: str, t: float) -> float:
        return float(self.script.group_values(self.node, group, [t])[0])

    def workers(self) -> list[tuple[str, int, int | None]]:
        """``(group, pid, start_ticks)`` of every scripted group, as a registry holds them."""
        return [(group, pid, self.fake.start_ticks(pid)) for group, pid in self.pids.items()]

    def advance(self, t: float) -> None:
        """Move to ``t`` seconds: RSS as scripted then, marks raised to the peak in between."""
        if t < self.t:
            raise ValueError(f"simulated time runs forward: at {self.t:g} s, asked for {t:g} s")
        for group, pid in self.pids.items():
            peak = self.script.group_peak(self.node, group, self.t, t, self.resolution)
            rss = _pages(self._value(group, t))
            self.fake.set_memory(pid, rss_bytes=rss, hwm_bytes=max(rss, _pages(peak)))
        self.t = t
