"""A run's memory on disk: one compact JSON line per cycle, kept bounded, readable after the run.

``raylens watch --record FILE`` and ``init_telemetry_driver(record=FILE)`` append a
:class:`Frame` per cycle with :class:`MemoryRecorder`: per node its used and total
memory, its kill line and each group's RSS; the phases in progress; the kills first seen
in that cycle. :func:`read_record` turns the file (and its rotated predecessor) back
into a :class:`RecordedRun`, which ``raylens plot`` draws.

Invariants a maintainer must keep:

- every line is one JSON object carrying ``"v": RECORD_VERSION``; a reader skips (and
  counts) lines that are not, so a file cut mid-line by a crash, or one a later version
  wrote, still gives what it can;
- the file is created private to the user (0600) and never grows past ``max_bytes``:
  the line that would take it past starts a fresh file, the full one moved to
  ``<path>.1`` (replacing the one before), so the pair holds at most twice the bound;
- appending never raises into the caller: a failure is logged once per path;
- each kill is written once, in the first frame that shows it;
- a line left unfinished (a crash mid-write) is closed before the next one is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from raylens.lens import warn_once
from raylens.safe_text import printable

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_LINE_BYTES",
    "RECORD_MODE",
    "RECORD_VERSION",
    "Frame",
    "KillMark",
    "MemoryRecorder",
    "NodeFrame",
    "NodeTrack",
    "PhaseSpan",
    "RecordedRun",
    "read_record",
    "run_from_postmortem",
]

logger = logging.getLogger("raylens.record")

RECORD_VERSION = 1
"""The ``v`` of every line this module writes; lines of another version are skipped."""
DEFAULT_MAX_RECORD_BYTES = 32 * 1024 * 1024
"""The size at which the file is moved to ``<path>.1`` and a fresh one begun."""
RECORD_MODE = 0o600
"""The permissions the file is created with: readable and writable by its owner only."""
MAX_LINE_BYTES = 4 * 1024 * 1024
"""A line longer than this is skipped unread."""
_MAX_NAME = 256
_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class NodeFrame:
    """One node at one cycle: bytes, None where not known."""

    node_id: str
    host: str
    used: float | None
    total: float | None
    limit: float | None = None
    groups: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Frame:
    """One cycle: its Unix time, its nodes, the phases in progress, kills (``as_plain`` dicts)."""

    time: float
    nodes: tuple[NodeFrame, ...]
    #: ``(job id, phase name, started at)`` of every phase in progress.
    phases: tuple[tuple[str, str, float], ...] = ()
    kills: tuple[Mapping[str, Any], ...] = ()


def _whole(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else round(value)


def frame_document(frame: Frame) -> dict[str, Any]:
    """``frame`` as the JSON object one line holds."""
    return {
        "v": RECORD_VERSION,
        "t": round(frame.time, 3),
        "nodes": [
            {
                "id": node.node_id,
                "host": node.host,
                "used": _whole(node.used),
                "total": _whole(node.total),
                "limit": _whole(node.limit),
                "groups": {name: _whole(value) for name, value in sorted(node.groups.items())},
            }
            for node in frame.nodes
        ],
        "phases": [[job, name, round(started, 3)] for job, name, started in frame.phases],
        "kills": [dict(kill) for kill in frame.kills],
    }


def _kill_key(kill: Mapping[str, Any]) -> tuple[object, ...]:
    return (kill.get("node_id"), kill.get("killer"), kill.get("unix_time"))


class MemoryRecorder:
    """Appends one line per :class:`Frame` to ``path`` (see the module docstring). Never raises.

    ``max_bytes`` bounds one file (default :data:`DEFAULT_MAX_RECORD_BYTES`). Thread-safe.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be an int of at least 1, got {max_bytes!r:.80}")
        self.path = os.fspath(path)
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"the record path must be a non-empty path, got {path!r:.80}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kills_written: dict[tuple[object, ...], None] = {}

    def append(self, frame: Frame) -> None:
        """Write ``frame`` as one line, its kills only if not written before."""
        with self._lock:
            fresh = tuple(k for k in frame.kills if _kill_key(k) not in self._kills_written)
            data = frame_document(Frame(frame.time, frame.nodes, frame.phases, fresh))
            line = (json.dumps(data, separators=(",", ":")) + "\n").encode()
            try:
                self._write(line)
            except OSError as error:
                warn_once(
                    f"memory_record.{printable(self.path[:120])}",
                    f"could not append to the memory record {printable(self.path[:200])!r} "
                    f"({printable(error)}); the run goes on unrecorded there (warned once)",
                    logger=logger,
                )
                return
            for kill in fresh:
                self._kills_written[_kill_key(kill)] = None
            while len(self._kills_written) > 1024:
                del self._kills_written[next(iter(self._kills_written))]

    def _write(self, data: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):
            size = os.stat(self.path).st_size
            if size and size + len(data) > self.max_bytes:
                os.replace(self.path, f"{self.path}.1")
        fd = os.open(self.path, _FLAGS, RECORD_MODE)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # a line cut short (a crash) stays a line of its own
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- reading


@dataclass
class NodeTrack:
    """One node over the run: times (Unix seconds) with its used memory, and each group's."""

    host: str
    times: list[float] = field(default_factory=list)
    used: list[float | None] = field(default_factory=list)
    limit: float | None = None
    groups: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class PhaseSpan:
    """A phase between two Unix times; ``start_known`` False when only its end is known."""

    name: str
    start: float
    end: float
    start_known: bool = True


@dataclass(frozen=True)
class KillMark:
    """An OOM kill: where, when (Unix seconds), by whom, and its first victim's group."""

    node_id: str
    time: float
    killer: str
    group: str | None


@dataclass
class RecordedRun:
    """What a record or post-mortem holds, ready to draw; ``skipped`` counts unreadable lines."""

    nodes: dict[str, NodeTrack] = field(default_factory=dict)
    phases: list[PhaseSpan] = field(default_factory=list)
    kills: list[KillMark] = field(default_factory=list)
    skipped: int = 0
    source: str = "record"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _name(value: object) -> str | None:
    return value[:_MAX_NAME] if isinstance(value, str) and value else None


def _lines(path: str) -> Iterator[bytes | None]:
    """Each line of ``path``; None for one too long to read."""
    with open(path, "rb") as handle:
        while True:
            line = handle.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):
                    line = handle.readline(MAX_LINE_BYTES + 1)
                yield None
                continue
            yield line


def read_record(path: str | os.PathLike[str]) -> RecordedRun:
    """The run recorded at ``path`` (``<path>.1`` first when it exists). OSError if unreadable.

    A line that is not a frame of :data:`RECORD_VERSION` costs only itself (counted in
    :attr:`RecordedRun.skipped`), as does a bad value inside one.
    """
    name = os.fspath(path)
    files = [p for p in (f"{name}.1", name) if os.path.exists(p)] or [name]
    run = RecordedRun()
    documents: list[dict[str, Any]] = []
    for file in files:
        for line in _lines(file):
            try:
                document = json.loads(line) if line is not None else None
            except (ValueError, RecursionError):
                document = None
            if not isinstance(document, dict) or document.get("v") != RECORD_VERSION:
                run.skipped += 1
                continue
            if _number(document.get("t")) is None:
                run.skipped += 1
                continue
            documents.append(document)
    documents.sort(key=lambda d: float(d["t"]))
    _fill(run, documents)
    return run


def _fill(run: RecordedRun, documents: Iterable[dict[str, Any]]) -> None:
    # Per phase in progress: where its span begins, and the last frame that showed it.
    open_phases: dict[tuple[str, str, float], tuple[float, float]] = {}
    seen_kills: set[tuple[object, ...]] = set()
    previous: float | None = None
    for document in documents:
        at = float(document["t"])
        for node in _list(document.get("nodes")):
            _add_node(run, node, at)
        current: set[tuple[str, str, float]] = set()
        for entry in _list(document.get("phases")):
            if isinstance(entry, list) and len(entry) == 3:
                job, phase, started = _name(entry[0]), _name(entry[1]), _number(entry[2])
                if job is not None and phase is not None and started is not None:
                    current.add((job, phase, started))
        for key in set(open_phases) - current:  # ended before this frame
            run.phases.append(PhaseSpan(key[1], open_phases.pop(key)[0], at))
        for key in current:
            began = open_phases[key][0] if key in open_phases else _began(key[2], previous, at)
            open_phases[key] = (began, at)
        previous = at
        for kill in _list(document.get("kills")):
            mark = _kill(kill)
            if mark is not None and _kill_key(kill) not in seen_kills:
                seen_kills.add(_kill_key(kill))
                run.kills.append(mark)
    for key, (began, last) in open_phases.items():
        run.phases.append(PhaseSpan(key[1], began, last))
    run.phases.sort(key=lambda span: span.start)


def _began(started_at: float, previous: float | None, first_seen: float) -> float:
    """Where a phase first seen at ``first_seen`` begins: its own ``started_at`` when that
    lies between the frame before and this one, else this frame (the stamp comes from the
    driver's clock, which may not agree with the recorder's)."""
    earliest = first_seen if previous is None else previous
    return started_at if earliest <= started_at <= first_seen else first_seen


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _add_node(run: RecordedRun, node: object, at: float) -> None:
    if not isinstance(node, dict):
        return
    node_id = _name(node.get("id"))
    if node_id is None:
        return
    track = run.nodes.get(node_id)
    if track is None:
        track = run.nodes[node_id] = NodeTrack(host=_name(node.get("host")) or "")
    track.times.append(at)
    track.used.append(_number(node.get("used")))
    limit = _number(node.get("limit"))
    if limit is not None:
        track.limit = limit
    groups = node.get("groups")
    if isinstance(groups, dict):
        for group, value in groups.items():
            name, rss = _name(group), _number(value)
            if name is None or rss is None:
                continue
            times, values = track.groups.setdefault(name, ([], []))
            times.append(at)
            values.append(rss)


def _kill(kill: object) -> KillMark | None:
    if not isinstance(kill, dict):
        return None
    node_id, at = _name(kill.get("node_id")), _number(kill.get("unix_time"))
    if node_id is None or at is None:
        return None
    return KillMark(
        node_id, at, _name(kill.get("killer")) or "unknown", _name(kill.get("worker_group"))
    )


def run_from_postmortem(document: object) -> RecordedRun:
    """The node, groups, kill and phase an OOM post-mortem holds, as a :class:`RecordedRun`.

    Times become Unix seconds (the post-mortem counts back from its kill). Folded
    history (buckets) is drawn at each bucket's mean, before the samples. The phase is
    known only as the one in progress at the kill: its span covers the history shown,
    with ``start_known`` False. ValueError when ``document`` is not a post-mortem.
    """
    if not isinstance(document, dict) or not str(document.get("schema", "")).startswith(
        "raylens.oom_postmortem/"
    ):
        raise ValueError("not a raylens OOM post-mortem (no raylens.oom_postmortem schema)")
    at = _number(document.get("unix_time"))
    node_id = _name(document.get("node_id"))
    if at is None or node_id is None:
        raise ValueError("the post-mortem has no unix_time or node_id")
    run = RecordedRun(source="postmortem")
    node = document.get("node")
    track = run.nodes[node_id] = NodeTrack(
        host=_name(document.get("host")) or "",
        limit=_number(node.get("limit_bytes")) if isinstance(node, dict) else None,
    )
    earliest = at
    used = _points(document.get("node_used"), at)
    track.times = [t for t, _ in used]
    track.used = [v for _, v in used]
    groups = document.get("worker_groups")
    for group, series in (groups if isinstance(groups, dict) else {}).items():
        name = _name(group)
        points = _points(series, at)
        if name is None or not points:
            continue
        track.groups[name] = ([t for t, _ in points], [v for _, v in points])
        earliest = min(earliest, points[0][0])
    if track.times:
        earliest = min(earliest, track.times[0])
    victim = document.get("victim")
    run.kills.append(
        KillMark(
            node_id,
            at,
            _name(document.get("killer")) or "unknown",
            _name(victim.get("group")) if isinstance(victim, dict) else None,
        )
    )
    phase = _name(document.get("phase"))
    if phase is not None:
        run.phases.append(PhaseSpan(phase, earliest, at, start_known=False))
    return run


def _points(series: object, at: float) -> list[tuple[float, float]]:
    """A post-mortem series as sorted ``(Unix time, bytes)``: bucket means, then samples."""
    if not isinstance(series, dict):
        return []
    points: list[tuple[float, float]] = []
    for bucket in _list(series.get("buckets")):
        if isinstance(bucket, list) and len(bucket) == 5:
            start, end, mean = _number(bucket[0]), _number(bucket[1]), _number(bucket[3])
            if start is not None and end is not None and mean is not None:
                points.append((at + (start + end) / 2, mean))
    for sample in _list(series.get("samples")):
        if isinstance(sample, list) and len(sample) == 2:
            offset, value = _number(sample[0]), _number(sample[1])
            if offset is not None and value is not None:
                points.append((at + offset, value))
    points.sort()
    return points
