"""One OOM kill's post-mortem: what it holds, and writing it as a JSON file.

:func:`build_postmortem` assembles the document from what the monitor's process
already holds: the node's last sample (used memory, kill line), every group's memory
on the node over the last :data:`HISTORY_S` seconds from the growth history, the
node's largest processes at its sampler's last reading, the victim where known and
the phase the job was in. :class:`PostMortemWriter` writes it:

- into ``RAYLENS_POSTMORTEM_DIR``, else ``<system temp dir>/raylens-postmortems``
  (created when missing);
- atomically: a temporary file in the same directory, flushed, then renamed over the
  final name, so a reader never sees half a post-mortem (a kill enriched later, when
  the victim becomes known, is rewritten the same way under the same name);
- under a safe name built by raylens (``oom-<UTC time>-<killer>-<node>-<n>.json``,
  the node id reduced to at most 16 of its letters and digits: ids are untrusted);
- at most :data:`DEFAULT_MAX_FILES` files per process (``max_files``), so a crash
  loop cannot fill a disk; kills past it are still counted and logged;
- never raising: a directory that cannot be made or a write that fails is logged
  once and the kill is still counted.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.history import HISTORY_S, MAX_POINTS_PER_SERIES, RecentHistory
from raylens.telemetry.oom._kills import Killer, Victim

__all__ = [
    "DEFAULT_MAX_FILES",
    "HISTORY_S",
    "MAX_POINTS_PER_SERIES",
    "POSTMORTEM_DIR_ENV",
    "SCHEMA",
    "LargestProcess",
    "PostMortemWriter",
    "build_postmortem",
    "default_postmortem_dir",
]

POSTMORTEM_DIR_ENV = "RAYLENS_POSTMORTEM_DIR"
SCHEMA = "raylens.oom_postmortem/1"
#: Most post-mortem files one process writes.
DEFAULT_MAX_FILES = 100
_MAX_TEXT = 200
_UNSAFE = re.compile(r"[^0-9A-Za-z]")
_LOGGER = logging.getLogger("raylens.oom")


@dataclass(frozen=True)
class LargestProcess:
    """One of a node's largest processes by RSS at its sampler's reading."""

    pid: int
    group: str
    rss_bytes: int


def default_postmortem_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``RAYLENS_POSTMORTEM_DIR`` if set (and not blank), else ``<temp dir>/raylens-postmortems``."""
    env = os.environ if environ is None else environ
    chosen = env.get(POSTMORTEM_DIR_ENV, "").strip()
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / "raylens-postmortems"


def _text(value: object) -> str:
    return printable(str(value)[:_MAX_TEXT])


def build_postmortem(
    *,
    node_id: str,
    host: str,
    killer: Killer,
    wall_time: float,
    victim: Victim | None,
    phase: str | None,
    limit_bytes: float | None,
    used_bytes: float | None,
    total_bytes: float | None,
    history: RecentHistory | None,
    largest: Sequence[LargestProcess] = (),
    largest_sampled_at: float | None = None,
    sources: Sequence[str] = (),
    kernel_count_source: str | None = None,
) -> dict[str, Any]:
    """The post-mortem of one kill as a JSON-ready dict (see the README for its fields).

    ``history`` is the node's recent memory up to the kill
    (:func:`~raylens.telemetry.history.recent_history`); ``wall_time`` is Unix time. Text from the cluster is cut and made printable.
    """
    groups: dict[str, Any] = {}
    node_series = other = None
    if history is not None:
        node_series, other = history["node_used"], history["outside_groups"]
        groups = {_text(name): series for name, series in history["worker_groups"].items()}
    known = victim or Victim()
    stamp = datetime.datetime.fromtimestamp(wall_time, tz=datetime.timezone.utc)
    return {
        "schema": SCHEMA,
        "node_id": _text(node_id),
        "host": _text(host),
        "time": stamp.isoformat(timespec="milliseconds"),
        "unix_time": round(wall_time, 3),
        "killer": killer.value,
        "victim": {
            "group": None if known.group is None else _text(known.group),
            "worker_rank": known.worker_rank,
            "pid": known.pid,
        },
        "phase": None if phase is None else _text(phase),
        "node": {
            "limit_bytes": None if limit_bytes is None else round(limit_bytes),
            "used_bytes": None if used_bytes is None else round(used_bytes),
            "total_bytes": None if total_bytes is None else round(total_bytes),
        },
        "history_seconds": HISTORY_S,
        "node_used": node_series,
        "worker_groups": groups,
        "outside_groups": other,
        "largest_processes": [
            {"pid": p.pid, "group": _text(p.group), "rss_bytes": p.rss_bytes} for p in largest
        ],
        "largest_processes_sampled_at": largest_sampled_at,
        "seen_by": sorted(set(sources)),
        "kernel_count_source": kernel_count_source,
    }


def _safe_node(node_id: str) -> str:
    return _UNSAFE.sub("", node_id)[:16] or "unknown"


class PostMortemWriter:
    """Writes post-mortems atomically into one directory; see the module docstring.

    ``directory`` defaults to :func:`default_postmortem_dir`, read when first needed.
    Thread-safe. :attr:`written` counts the files written so far.
    """

    def __init__(
        self, directory: str | os.PathLike[str] | None = None, *, max_files: int = DEFAULT_MAX_FILES
    ) -> None:
        if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 0:
            raise ValueError(f"max_files must be an int of at least 0, got {max_files!r}")
        self._directory = None if directory is None else Path(directory)
        self.max_files = max_files
        self.written = 0
        self._lock = threading.Lock()

    @property
    def directory(self) -> Path:
        """Where the files go."""
        if self._directory is None:
            self._directory = default_postmortem_dir()
        return self._directory

    def name_for(self, document: Mapping[str, Any]) -> str:
        """The file name of a new post-mortem (unique within this writer)."""
        stamp = datetime.datetime.fromtimestamp(
            float(document["unix_time"]), tz=datetime.timezone.utc
        )
        return (
            f"oom-{stamp.strftime('%Y%m%dT%H%M%S')}-{document['killer']}-"
            f"{_safe_node(str(document['node_id']))}-{os.getpid()}-{self.written + 1}.json"
        )

    def write(self, document: Mapping[str, Any], path: Path | None = None) -> Path | None:
        """Write ``document``: to ``path`` (a rewrite) or under a new name; the path, or None.

        None when the file cap is reached or writing failed (logged once each). Never raises.
        """
        with self._lock:
            try:
                if path is None:
                    if self.written >= self.max_files:
                        warn_once(
                            "oom.postmortem.cap",
                            f"raylens wrote its {self.max_files} OOM post-mortems for this "
                            "process; later kills are counted and logged but get no file",
                            logger=_LOGGER,
                        )
                        return None
                    directory = self.directory
                    directory.mkdir(parents=True, exist_ok=True)
                    path = directory / self.name_for(document)
                    self.written += 1
                _write_atomically(
                    path, json.dumps(document, separators=(",", ":"), allow_nan=False)
                )
                return path
            except Exception as error:
                warn_once(
                    "oom.postmortem.write",
                    f"raylens could not write an OOM post-mortem into {printable(str(self.directory))}: "
                    f"{type(error).__name__}: {printable(str(error)[:200])} (warned once; set "
                    f"{POSTMORTEM_DIR_ENV} to a writable directory)",
                    logger=_LOGGER,
                )
                return None


def _write_atomically(path: Path, text: str) -> None:
    fd, temporary = tempfile.mkstemp(prefix=".oom-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
