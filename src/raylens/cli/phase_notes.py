"""Phases in the node table: the title's phase in progress, and the line under it that says
what each job's last ended phase cost, per group."""

from __future__ import annotations

from raylens.live_table import format_age, format_bytes
from raylens.safe_text import printable
from raylens.telemetry.phases.board import CurrentPhase, EndedPhase

__all__ = ["GROUPS_SHOWN", "ended_phase_line", "phase_on_board", "phase_title"]

GROUPS_SHOWN = 4
"""Groups one line names (those with the largest peaks); the rest are counted."""


def ended_phase_line(ended: EndedPhase, *, now: float, several_jobs: bool = False) -> str:
    """``last phase 'train' (12.5 s, ended 3s ago): policy peak 400.0 MiB (+10.0 MiB) on aaaa...``.

    The delta is the group's on the node of its peak, from the phase's start to its end.
    """
    job = f" of job {printable(ended.job_id[:16])}" if several_jobs else ""
    head = (
        f"last phase {printable(repr(ended.phase[:64]))}{job} ({ended.duration_s:.1f} s, "
        f"ended {format_age(max(0.0, now - ended.ended_at))} ago)"
    )
    shown = sorted(ended.groups, key=lambda g: (-g.peak_bytes, g.group))[:GROUPS_SHOWN]
    if not shown:
        return f"{head}: no group figures"
    parts = [
        f"{printable(g.group[:40])} peak {format_bytes(g.peak_bytes)} "
        f"({'+' if g.delta_bytes >= 0 else '-'}{format_bytes(abs(g.delta_bytes))}) "
        f"on {printable(g.node_id[:8])}"
        for g in shown
    ]
    more = len(ended.groups) - len(shown)
    return f"{head}: " + "; ".join(parts) + (f"; {more} more group(s)" if more > 0 else "")


def phase_on_board(phases: list[CurrentPhase]) -> str | None:
    """The phase in progress (several jobs' distinct phases joined), or None."""
    names = sorted({current.phase for current in phases})
    return ", ".join(names) if names else None


def phase_title(title: str, phases: list[CurrentPhase]) -> str:
    """``title`` followed by the phase in progress (the job's id too when several jobs have one)."""
    if not phases:
        return title
    if len(phases) == 1:
        return f"{title} | phase {printable(phases[0].phase)}"
    shown = ", ".join(f"{printable(p.phase)} (job {printable(p.job_id[:16])})" for p in phases[:4])
    more = f" and {len(phases) - 4} more" if len(phases) > 4 else ""
    return f"{title} | phases {shown}{more}"
