"""The current phase of every job, shared through the cluster's key-value store.

The driver that enters a phase writes ``{"phase": name, "started_at": unix time}`` under
``phase/<job id>`` (Ray's internal KV, namespace ``raylens``, as the placement is) and
deletes the key when the phase ends; any process connected to the cluster (``raylens
watch``) reads every live job's entry with :func:`read_current_phases`.

Entries are untrusted: any job can write any key. An entry larger than
:data:`MAX_PHASE_ENTRY_BYTES` is refused before it is decoded, one that is not the expected
object, or whose name is not a valid phase name, is skipped with one warning naming its key,
and a bad entry costs only itself. Keys of jobs the GCS does not list as live (a driver
killed inside a phase, or a key no job owns) are left out before the read is bounded, so
they cannot hide a live job's phase, and deleted (at most :data:`MAX_JOBS_READ` per call).
At most :data:`MAX_JOBS_READ` live entries are read per call. Publishing and reading never
raise.

When a phase ends, the driver also writes its summary under ``ended_phase/<job id>``
(:func:`publish_ended_phase`): per group, its largest peak, the node it was on and its
delta there, at most :data:`MAX_ENDED_GROUPS` groups (the largest peaks), so ``watch``
shows the last ended phase of every live job (:func:`read_ended_phases`). Those entries
are read under the same rules as the current phase's.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

from raylens.cluster import ClusterView, ray_call_errors, supports_key_value
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.phases.memory import PhaseRecord, check_phase_name

__all__ = [
    "ENDED_PHASE_KEY_PREFIX",
    "MAX_ENDED_GROUPS",
    "MAX_ENDED_PHASE_BYTES",
    "MAX_JOBS_READ",
    "MAX_PHASE_ENTRY_BYTES",
    "PHASE_KEY_PREFIX",
    "CurrentPhase",
    "EndedGroup",
    "EndedPhase",
    "clear_current_phase",
    "publish_current_phase",
    "publish_ended_phase",
    "read_current_phases",
    "read_ended_phases",
]

logger = logging.getLogger("raylens.phases")

PHASE_KEY_PREFIX = "phase/"
"""Key of a job's current phase, followed by the job id."""
MAX_PHASE_ENTRY_BYTES = 1024
"""A published phase entry larger than this is refused before it is decoded."""
MAX_JOBS_READ = 256
"""Most live jobs' entries one read decodes, and most ended jobs' keys it deletes."""
ENDED_PHASE_KEY_PREFIX = "ended_phase/"
"""Key of the summary of a job's last ended phase, followed by the job id."""
MAX_ENDED_GROUPS = 16
"""Most groups one ended phase's summary holds: those with the largest peaks."""
MAX_ENDED_PHASE_BYTES = 8192
"""An ended phase's summary larger than this is refused before it is decoded."""
_MAX_NAME_CHARS = 128


@dataclass(frozen=True)
class CurrentPhase:
    """A job's phase in progress: its name and when it began (unix time)."""

    job_id: str
    phase: str
    started_at: float

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class EndedGroup:
    """One group over an ended phase: its largest peak, on which node, and its delta there."""

    group: str
    node_id: str
    peak_bytes: int
    delta_bytes: int
    source: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class EndedPhase:
    """A job's last ended phase: its name, when it ended (unix time), how long, its groups."""

    job_id: str
    phase: str
    ended_at: float
    duration_s: float
    groups: tuple[EndedGroup, ...]

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "groups": [group.to_json() for group in self.groups]}


def publish_ended_phase(cluster: ClusterView, record: PhaseRecord) -> bool:
    """Write ``record``'s summary as this job's last ended phase; whether it was done. Never raises."""
    peaks = sorted(
        record.largest_peaks().items(), key=lambda item: (-item[1][1].peak_bytes, item[0])
    )[:MAX_ENDED_GROUPS]
    document: dict[str, Any] = {
        "phase": record.phase,
        "ended_at": record.ended_at,
        "duration_s": record.duration_s,
        "groups": [
            [name[:_MAX_NAME_CHARS], node[:_MAX_NAME_CHARS], g.peak_bytes, g.delta_bytes, g.source]
            for name, (node, g) in sorted(peaks)
        ],
    }
    try:
        if not supports_key_value(cluster) or not cluster.is_initialized():
            return False
        job = cluster.job_id()
        if not job:
            return False
        raw = json.dumps(document, separators=(",", ":")).encode()
        while len(raw) > MAX_ENDED_PHASE_BYTES and document["groups"]:
            smallest = min(document["groups"], key=lambda row: row[2])
            document["groups"].remove(smallest)
            raw = json.dumps(document, separators=(",", ":")).encode()
        cluster.kv_put(f"{ENDED_PHASE_KEY_PREFIX}{job}", raw)
        return True
    except ray_call_errors() as error:
        warn_once(
            "phases.publish_ended",
            f"could not publish the ended phase's figures to the cluster "
            f"({type(error).__name__}: {printable(error)[:200]}); watch will not show them "
            "(warned once)",
            logger=logger,
        )
        return False


def read_ended_phases(cluster: ClusterView) -> list[EndedPhase]:
    """The last ended phase of every live job that published one, by job id. Never raises.

    Entries of jobs that have exited are deleted; a malformed entry is skipped with one
    warning naming its key.
    """
    phases: list[EndedPhase] = []
    for job, raw in _live_entries(cluster, ENDED_PHASE_KEY_PREFIX, "ended phases"):
        try:
            phases.append(_decode_ended(job, raw))
        except (TypeError, ValueError, RecursionError) as error:
            _ignored(f"{ENDED_PHASE_KEY_PREFIX}{job}", printable(error)[:200])
    return phases


def _live_entries(cluster: ClusterView, prefix: str, what: str) -> list[tuple[str, object]]:
    """``(job id, raw entry)`` under ``prefix`` of live jobs; ended jobs' keys deleted."""
    try:
        if not supports_key_value(cluster) or not cluster.is_initialized():
            return []
        keys = sorted(cluster.kv_keys(prefix))
        live = cluster.live_job_ids() if keys else set()
        current = [key for key in keys if key[len(prefix) :] in live]
        for key in [key for key in keys if key[len(prefix) :] not in live][:MAX_JOBS_READ]:
            cluster.kv_delete(key)
        return [(key[len(prefix) :], cluster.kv_get(key)) for key in current[:MAX_JOBS_READ]]
    except ray_call_errors() as error:
        warn_once(
            f"phases.read.{what}",
            f"could not read the {what} other processes published ({type(error).__name__}: "
            f"{printable(error)[:200]}); none is shown (warned once)",
            logger=logger,
        )
        return []


def _ignored(key: str, refusal: str) -> None:
    shown = printable(repr(key))[:120]
    warn_once(
        f"phases.entry.{shown}",
        f"ignored the phase published under key {shown}: {refusal}",
        logger=logger,
    )


def _decode_ended(job: str, raw: object) -> EndedPhase:
    if not isinstance(raw, bytes):
        raise TypeError(f"a {type(raw).__name__}, not bytes")
    if len(raw) > MAX_ENDED_PHASE_BYTES:
        raise ValueError(
            f"it takes {len(raw):,} bytes, more than the {MAX_ENDED_PHASE_BYTES:,} an entry "
            "may take"
        )
    document = json.loads(raw.decode("utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"a JSON {type(document).__name__}, not an object")
    name = check_phase_name(document.get("phase"))
    ended = _finite(document, "ended_at")
    duration = _finite(document, "duration_s")
    rows = document.get("groups")
    if not isinstance(rows, list) or len(rows) > MAX_ENDED_GROUPS:
        raise ValueError(f"groups must be a list of at most {MAX_ENDED_GROUPS} rows")
    groups = []
    for row in rows:  # a bad row costs only itself
        if not isinstance(row, list) or len(row) != 5:
            continue
        group, node, peak, delta, source = row
        names_ok = all(isinstance(v, str) and 0 < len(v) <= _MAX_NAME_CHARS for v in (group, node))
        numbers_ok = all(
            isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**63 for v in (peak, delta)
        )
        if names_ok and numbers_ok and isinstance(source, str) and peak >= 0:
            groups.append(EndedGroup(group, node, peak, delta, source[:16]))
    return EndedPhase(job, name, ended, duration, tuple(groups))


def _finite(document: dict[str, Any], key: str) -> float:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} is {value!r:.80}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"{key} is {value!r:.80}, not a finite number")
    return float(value)


def publish_current_phase(cluster: ClusterView, phase: str | None, started_at: float = 0.0) -> bool:
    """Write (or, with ``phase`` None, delete) this job's entry; whether it was done. Never raises."""
    try:
        if not supports_key_value(cluster) or not cluster.is_initialized():
            return False
        job = cluster.job_id()
        if not job:
            return False
        key = f"{PHASE_KEY_PREFIX}{job}"
        if phase is None:
            cluster.kv_delete(key)
        else:
            document = {"phase": phase, "started_at": started_at}
            cluster.kv_put(key, json.dumps(document).encode())
        return True
    except ray_call_errors() as error:
        warn_once(
            "phases.publish",
            f"could not publish the current phase to the cluster ({type(error).__name__}: "
            f"{printable(error)[:200]}); other processes will not show it (warned once)",
            logger=logger,
        )
        return False


def clear_current_phase(cluster: ClusterView) -> bool:
    """Delete this job's entry; whether it was done. Never raises."""
    return publish_current_phase(cluster, None)


def read_current_phases(cluster: ClusterView) -> list[CurrentPhase]:
    """The phase in progress of every live job that published one, by job id. Never raises.

    Entries of jobs that have exited are skipped and deleted (their driver may have died
    inside a phase); a malformed entry is skipped with one warning naming its key.
    """
    try:
        if not supports_key_value(cluster) or not cluster.is_initialized():
            return []
        # Keys first, then the live jobs: a job that writes its key in between is listed.
        keys = sorted(cluster.kv_keys(PHASE_KEY_PREFIX))
        live = cluster.live_job_ids() if keys else set()
        current = [key for key in keys if key[len(PHASE_KEY_PREFIX) :] in live]
        ended = [key for key in keys if key[len(PHASE_KEY_PREFIX) :] not in live]
        for key in ended[:MAX_JOBS_READ]:
            cluster.kv_delete(key)
        raw_entries = [(key, cluster.kv_get(key)) for key in current[:MAX_JOBS_READ]]
    except ray_call_errors() as error:
        warn_once(
            "phases.read",
            f"could not read the phases other processes published ({type(error).__name__}: "
            f"{printable(error)[:200]}); no phase is shown (warned once)",
            logger=logger,
        )
        return []
    phases = []
    for key, raw in raw_entries:
        try:
            phases.append(_decode(key[len(PHASE_KEY_PREFIX) :], raw))
        except (TypeError, ValueError, RecursionError) as error:
            refusal = printable(error)[:200]
        else:
            continue
        shown = printable(repr(key))[:120]
        warn_once(
            f"phases.entry.{shown}",
            f"ignored the phase published under key {shown}: {refusal}",
            logger=logger,
        )
    return phases


def _decode(job: str, raw: object) -> CurrentPhase:
    if not isinstance(raw, bytes):
        raise TypeError(f"a {type(raw).__name__}, not bytes")
    if len(raw) > MAX_PHASE_ENTRY_BYTES:
        raise ValueError(
            f"it takes {len(raw):,} bytes, more than the {MAX_PHASE_ENTRY_BYTES:,} an entry may take"
        )
    document = json.loads(raw.decode("utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"a JSON {type(document).__name__}, not an object")
    name = check_phase_name(document.get("phase"))
    started = document.get("started_at")
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        raise ValueError(f"started_at is {started!r:.80}, not a number")
    if not math.isfinite(started):
        raise ValueError(f"started_at is {started!r:.80}, not a finite number")
    return CurrentPhase(job, name, float(started))
