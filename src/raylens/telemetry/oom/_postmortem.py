"""One OOM kill's post-mortem: what it holds, and writing it as a JSON file.

:func:`build_postmortem` assembles the document from what the monitor's process
already holds: the node's last sample (used memory, kill line), every group's memory
on the node over the last :data:`HISTORY_S` seconds, the node's largest processes at
its sampler's last reading, the victims where known and the phase the job was in; it
is cut to its size bound (:mod:`._bounds`). :class:`PostMortemWriter` writes it:

- into ``RAYLENS_POSTMORTEM_DIR``, else ``<system temp dir>/raylens-postmortems-<uid>``;
  the default directory is created private (0700) and used only while it is a real
  directory (not a symbolic link) owned by this user, checked with ``lstat`` and held
  open with ``O_NOFOLLOW`` so that it cannot be swapped between check and write;
- files 0600, under a name nobody else writes (``oom-<UTC time>-<killer>-<node>-<pid>-
  <random>.json``, the node id reduced to at most 16 of its letters and digits: ids are
  untrusted), created with ``O_EXCL`` and made visible whole (a temporary file linked to
  its final name, which fails rather than replaces), so two writers in one second, in
  one process or two sharing a volume, never overwrite each other;
- at most :data:`DEFAULT_MAX_FILES` files per process, whichever writer writes them;
  a write that fails does not count;
- never raising: a directory that cannot be used or a write that fails is logged once
  and the kill is still counted.

A kill whose victim is named later is rewritten in place (:meth:`PostMortemWriter.amend`):
the file is read back, bounded, and replaced whole.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raylens import forking
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.growth import HISTORY_S, MAX_POINTS_PER_SERIES, RecentHistory
from raylens.telemetry.oom._bounds import MAX_POSTMORTEM_BYTES, fit_document, fit_groups
from raylens.telemetry.oom._kills import Killer, Victim

__all__ = [
    "DEFAULT_MAX_FILES",
    "HISTORY_S",
    "MAX_POINTS_PER_SERIES",
    "MAX_POSTMORTEM_BYTES",
    "MAX_VICTIMS_LISTED",
    "POSTMORTEM_DIR_ENV",
    "SCHEMA",
    "LargestProcess",
    "PostMortemWriter",
    "build_postmortem",
    "default_postmortem_dir",
    "reset_postmortem_budget",
    "victim_fields",
]

POSTMORTEM_DIR_ENV = "RAYLENS_POSTMORTEM_DIR"
SCHEMA = "raylens.oom_postmortem/2"
#: Most post-mortem files one process writes.
DEFAULT_MAX_FILES = 100
#: Most victims one post-mortem lists (the rest are counted).
MAX_VICTIMS_LISTED = 16
_NAME_ATTEMPTS = 4
_MAX_TEXT = 200
_UNSAFE = re.compile(r"[^0-9A-Za-z]")
_LOGGER = logging.getLogger("raylens.oom")


@dataclass(frozen=True)
class LargestProcess:
    """One of a node's largest processes by RSS at its sampler's reading."""

    pid: int
    group: str
    rss_bytes: int


def _private_default() -> Path:
    return Path(tempfile.gettempdir()) / f"raylens-postmortems-{os.getuid()}"


def default_postmortem_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``RAYLENS_POSTMORTEM_DIR`` if set (and not blank), else ``<temp dir>/raylens-postmortems-<uid>``."""
    env = os.environ if environ is None else environ
    chosen = env.get(POSTMORTEM_DIR_ENV, "").strip()
    return Path(chosen) if chosen else _private_default()


def _text(value: object) -> str:
    return printable(str(value)[:_MAX_TEXT])


def victim_fields(victim: Victim) -> dict[str, Any]:
    """One victim as a post-mortem lists it (text cut and made printable)."""
    return {
        "group": None if victim.group is None else _text(victim.group),
        "worker_rank": victim.worker_rank,
        "pid": victim.pid,
        "ray_name": None if victim.ray_name is None else _text(victim.ray_name),
    }


def build_postmortem(
    *,
    node_id: str,
    host: str,
    killer: Killer,
    wall_time: float,
    victims: Sequence[Victim] = (),
    kills: int = 1,
    phase: str | None,
    limit_bytes: float | None,
    used_bytes: float | None,
    total_bytes: float | None,
    history: RecentHistory | None,
    largest: Sequence[LargestProcess] = (),
    largest_sampled_at: float | None = None,
    sampler_killed: bool = False,
    sources: Sequence[str] = (),
    kernel_count_source: str | None = None,
) -> dict[str, Any]:
    """The post-mortem of one kill event as a JSON-ready dict (see the README for its fields).

    ``kills`` is how many workers the event took (one eviction round may take
    several); ``victims`` those known, of which :data:`MAX_VICTIMS_LISTED` are listed.
    ``history`` is the node's recent memory up to the kill
    (:func:`~raylens.telemetry.growth.recent_history`); ``wall_time`` is Unix time. Text
    from the cluster is cut and made printable. Groups past the largest and
    fastest-growing :data:`~raylens.telemetry.oom._bounds.MAX_GROUPS_SHOWN` are summed
    under ``other_groups``.
    """
    groups: dict[str, Any] = {}
    node_series = other = other_groups = None
    if history is not None:
        node_series, other = history["node_used"], history["outside_groups"]
        groups, other_groups = fit_groups(
            {_text(name): series for name, series in history["worker_groups"].items()}
        )
    listed = [victim_fields(v) for v in victims[:MAX_VICTIMS_LISTED]]
    stamp = datetime.datetime.fromtimestamp(wall_time, tz=datetime.timezone.utc)
    return {
        "schema": SCHEMA,
        "node_id": _text(node_id),
        "host": _text(host),
        "time": stamp.isoformat(timespec="milliseconds"),
        "unix_time": round(wall_time, 3),
        "killer": killer.value,
        "kills": max(int(kills), len(victims)),
        "victim": listed[0] if listed else victim_fields(Victim()),
        "victims": listed,
        "victims_not_listed": max(0, len(victims) - MAX_VICTIMS_LISTED),
        "phase": None if phase is None else _text(phase),
        "node": {
            "limit_bytes": None if limit_bytes is None else round(limit_bytes),
            "used_bytes": None if used_bytes is None else round(used_bytes),
            "total_bytes": None if total_bytes is None else round(total_bytes),
        },
        "history_seconds": HISTORY_S,
        "node_used": node_series,
        "worker_groups": groups,
        "other_groups": other_groups,
        "outside_groups": other,
        "largest_processes": [
            {"pid": p.pid, "group": _text(p.group), "rss_bytes": p.rss_bytes} for p in largest
        ],
        "largest_processes_sampled_at": largest_sampled_at,
        "sampler_killed": sampler_killed,
        "seen_by": sorted(set(sources)),
        "kernel_count_source": kernel_count_source,
    }


def _safe_node(node_id: str) -> str:
    return _UNSAFE.sub("", node_id)[:16] or "unknown"


class _ProcessBudget:
    """Files written by every writer of this process (a forked child starts at 0)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.used = 0
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        self.lock = threading.Lock()
        self.used = 0


_BUDGET = _ProcessBudget()


def reset_postmortem_budget() -> None:
    """Forget the files this process wrote (tests)."""
    with _BUDGET.lock:
        _BUDGET.used = 0


class PostMortemWriter:
    """Writes post-mortems into one directory; see the module docstring.

    ``directory`` defaults to :func:`default_postmortem_dir`, read when first needed
    (the default one alone is held to the private-directory checks: a directory the user
    names is the user's choice). ``max_files`` caps the files this process writes while
    this writer writes. Thread-safe. :attr:`written` counts this writer's files.
    """

    def __init__(
        self, directory: str | os.PathLike[str] | None = None, *, max_files: int = DEFAULT_MAX_FILES
    ) -> None:
        if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 0:
            raise ValueError(f"max_files must be an int of at least 0, got {max_files!r}")
        self._directory = None if directory is None else Path(directory)
        self._strict: bool | None = None if directory is None else False
        self.max_files = max_files
        self.written = 0

    @property
    def directory(self) -> Path:
        """Where the files go."""
        if self._directory is None:
            self._directory = default_postmortem_dir()
            self._strict = self._directory == _private_default()
        return self._directory

    def name_for(self, document: Mapping[str, Any]) -> str:
        """A new, unguessable file name for ``document``."""
        stamp = datetime.datetime.fromtimestamp(
            float(document["unix_time"]), tz=datetime.timezone.utc
        )
        return (
            f"oom-{stamp.strftime('%Y%m%dT%H%M%S')}-{document['killer']}-"
            f"{_safe_node(str(document['node_id']))}-{os.getpid()}-{secrets.token_hex(4)}.json"
        )

    def write(self, document: dict[str, Any]) -> Path | None:
        """Write ``document`` (cut to its bound, in place) as a new file; its path, or None.

        None when the process's file cap is reached or writing failed (logged once each).
        Never raises.
        """
        with _BUDGET.lock:
            if _BUDGET.used >= self.max_files:
                warn_once(
                    "oom.postmortem.cap",
                    f"raylens wrote its {self.max_files} OOM post-mortems for this "
                    "process; later kills are counted and logged but get no file",
                    logger=_LOGGER,
                )
                return None
            path = self._guarded(lambda: self._create(fit_document(document), document))
            if path is not None:
                _BUDGET.used += 1
                self.written += 1
            return path

    def amend(self, path: Path, change: Callable[[dict[str, Any]], None]) -> Path | None:
        """Read back a file this writer wrote, apply ``change`` to it, replace it whole.

        The path, or None when it could not be done (logged once). Never raises.
        """
        return self._guarded(lambda: self._amend(path, change))

    def _guarded(self, action: Callable[[], Path]) -> Path | None:
        try:
            return action()
        except (OSError, ValueError, TypeError, LookupError, RecursionError) as error:
            # The file system, and JSON refusing a document or one read back malformed.
            warn_once(
                "oom.postmortem.write",
                f"raylens could not write an OOM post-mortem into {printable(str(self.directory))}: "
                f"{type(error).__name__}: {printable(str(error)[:200])} (warned once; set "
                f"{POSTMORTEM_DIR_ENV} to a writable directory of your own)",
                logger=_LOGGER,
            )
            return None

    def _open_directory(self) -> int:
        directory = self.directory
        if not self._strict:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            return os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        return _open_private_directory(directory)

    def _create(self, text: str, document: Mapping[str, Any]) -> Path:
        folder = self._open_directory()
        try:
            temporary = _write_temporary(folder, text)
            try:
                for _ in range(_NAME_ATTEMPTS):
                    name = self.name_for(document)
                    try:
                        os.link(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
                    except FileExistsError:
                        continue
                    return self.directory / name
                raise FileExistsError(f"{_NAME_ATTEMPTS} new file names were all taken")
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=folder)
        finally:
            os.close(folder)

    def _amend(self, path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
        folder = self._open_directory()
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
            with os.fdopen(fd, "rb") as handle:
                raw = handle.read(MAX_POSTMORTEM_BYTES + 1)
            if len(raw) > MAX_POSTMORTEM_BYTES:
                raise ValueError(f"{path.name} is larger than a post-mortem may be")
            document = json.loads(raw.decode("utf-8"))
            if not isinstance(document, dict) or document.get("schema") != SCHEMA:
                raise ValueError(f"{path.name} is not a raylens post-mortem")
            change(document)
            temporary = _write_temporary(folder, fit_document(document))
            replaced = False
            try:
                os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
                replaced = True
            finally:
                if not replaced:
                    with contextlib.suppress(OSError):
                        os.unlink(temporary, dir_fd=folder)
            return path
        finally:
            os.close(folder)


def _open_private_directory(directory: Path) -> int:
    """The default directory, opened; made 0700 if missing, refused unless it is our own."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    seen = os.lstat(directory)
    if stat.S_ISLNK(seen.st_mode) or not stat.S_ISDIR(seen.st_mode):
        raise PermissionError(f"{directory} is not a directory (a symbolic link or a file)")
    if seen.st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to user id {seen.st_uid}, not this user")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    checked = False
    try:
        held = os.fstat(fd)
        if (held.st_dev, held.st_ino) != (seen.st_dev, seen.st_ino) or held.st_uid != os.getuid():
            raise PermissionError(f"{directory} changed while it was being opened")
        if stat.S_IMODE(held.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
        checked = True
    finally:
        if not checked:
            os.close(fd)
    return fd


def _write_temporary(folder: int, text: str) -> str:
    """A new 0600 file in ``folder`` holding ``text``, flushed to disk; its name."""
    for _ in range(_NAME_ATTEMPTS):
        name = f".oom-{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
            )
        except FileExistsError:
            continue
        written = False
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            written = True
        finally:
            if not written:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=folder)
        return name
    raise FileExistsError(f"{_NAME_ATTEMPTS} temporary file names were all taken")
