"""What ``watch --record`` (and the demo's) writes per sample: the table's rows as a frame."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from raylens.cli.parser import CliError
from raylens.safe_text import printable
from raylens.telemetry.memory_record import Frame, MemoryRecorder, NodeFrame

if TYPE_CHECKING:
    from raylens.live_table import NodeRow
    from raylens.telemetry.phases.board import CurrentPhase

__all__ = ["frame_of_rows", "open_recorder"]


def open_recorder(path: str | None) -> MemoryRecorder | None:
    """The recorder of ``--record PATH`` (None without one); CliError if PATH cannot be written.

    The file is opened once here so that a bad path is refused before anything starts;
    later failures are logged once and the watch goes on.
    """
    if path is None:
        return None
    try:
        recorder = MemoryRecorder(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.close(fd)
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CliError(
            f"--record {printable(repr(path))}: cannot write there: {printable(reason)}"
        ) from None
    return recorder


def frame_of_rows(
    at: float,
    rows: Sequence[NodeRow],
    phases: Sequence[CurrentPhase],
    kills: Sequence[Mapping[str, Any]],
) -> Frame:
    """One frame of the table's ``rows`` (failing nodes left out), ``phases`` and ``kills``."""
    return Frame(
        time=at,
        nodes=tuple(
            NodeFrame(row.node_id, row.host, row.used, row.total, row.limit, dict(row.group_rss))
            for row in rows
            if row.error is None
        ),
        phases=tuple((p.job_id, p.phase, p.started_at) for p in phases),
        kills=tuple(kills),
    )
