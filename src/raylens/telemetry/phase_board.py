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
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

from raylens.cluster import ClusterView, supports_key_value
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.phase_memory import check_phase_name

__all__ = [
    "MAX_JOBS_READ",
    "MAX_PHASE_ENTRY_BYTES",
    "PHASE_KEY_PREFIX",
    "CurrentPhase",
    "clear_current_phase",
    "publish_current_phase",
    "read_current_phases",
]

logger = logging.getLogger("raylens.phases")

PHASE_KEY_PREFIX = "phase/"
"""Key of a job's current phase, followed by the job id."""
MAX_PHASE_ENTRY_BYTES = 1024
"""A published phase entry larger than this is refused before it is decoded."""
MAX_JOBS_READ = 256
"""Most live jobs' entries one read decodes, and most ended jobs' keys it deletes."""


@dataclass(frozen=True)
class CurrentPhase:
    """A job's phase in progress: its name and when it began (unix time)."""

    job_id: str
    phase: str
    started_at: float

    def to_json(self) -> dict[str, object]:
        return {"job_id": self.job_id, "phase": self.phase, "started_at": self.started_at}


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
    except Exception as error:
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
    except Exception as error:
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
