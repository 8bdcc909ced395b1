"""Which node samplers raylens started: the ids a monitor believes series from.

Any job on a cluster can publish series under raylens' names on any node's endpoint, so a
reader believes a sampler's series only when its id (the Ray actor id it publishes as its
``rl_sampler`` label) is known, and only under the Ray worker id known for it (Ray stamps
every series with the worker that set it, so copying a sampler's id into another job's
labels gains nothing once that is known): the samplers this process started, and those
other drivers listed in the cluster's registry. A driver that starts samplers writes
``{actor id: worker id}`` of each (``""`` while its worker id is not known) under
``sampler/<job id>`` (Ray's internal KV, namespace ``raylens``, as the placement and
the phases are); any reader (another driver, ``raylens watch``) reads every live job's
entry.

Entries are untrusted like every key there: one over :data:`MAX_ENTRY_BYTES` is refused
before it is decoded, one that is not an object of short strings is left out, each with one
warning naming its key; at most :data:`MAX_IDS_PER_ENTRY` ids are taken from an entry and
at most :data:`MAX_JOBS_READ` entries are read. When the store cannot be read, the ids this
process started are the ones believed, said once. Nothing here raises.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping

from raylens.cluster import (
    ClusterView,
    default_cluster_view,
    ray_call_errors,
    supports_key_value,
)
from raylens.lens import warn_once
from raylens.safe_text import printable

__all__ = [
    "MAX_ENTRY_BYTES",
    "MAX_IDS_PER_ENTRY",
    "MAX_ID_CHARS",
    "MAX_JOBS_READ",
    "REFRESH_S",
    "SAMPLER_KEY_PREFIX",
    "SamplerRegistry",
]

logger = logging.getLogger("raylens.distributed")

SAMPLER_KEY_PREFIX = "sampler/"
"""Key of a job's sampler ids, followed by the job id."""
MAX_IDS_PER_ENTRY = 4096
"""Most sampler ids kept by a process, and taken from one job's entry."""
MAX_ID_CHARS = 80
"""Longest sampler id taken (a Ray actor id is 32 hex characters)."""
MAX_ENTRY_BYTES = MAX_IDS_PER_ENTRY * (2 * MAX_ID_CHARS + 8) + 2
"""An entry larger than this is refused before it is decoded."""
MAX_JOBS_READ = 64
"""Most live jobs' entries one read decodes."""
REFRESH_S = 30.0
"""How often :meth:`SamplerRegistry.trusted` reads the cluster's entries again."""


class SamplerRegistry:
    """The sampler ids a monitor believes: its own, and the cluster's registered ones.

    ``cluster`` defaults to the cluster view in force when first used; ``clock`` (default
    :func:`time.monotonic`) times the re-reads. Thread-safe.
    """

    def __init__(
        self,
        cluster: ClusterView | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._cluster = cluster
        self._clock = clock
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        # Insertion-ordered: past the cap, the oldest started go first.
        self._own: dict[str, str] = {}
        self._learned: dict[str, str] = {}
        self._read_at: float | None = None
        # Bumped whenever what is believed changes: a cycle in which nothing did costs a
        # comparison, and hands its monitor the very mapping it handed before.
        self._version = 0
        self._merged: tuple[int, dict[str, str]] = (0, {})
        # The version of this process's ids last written, and when a write last failed.
        self._own_version = 0
        self._written = -1
        self._failed_at: float | None = None

    def _view(self) -> ClusterView:
        if self._cluster is None:
            self._cluster = default_cluster_view()
        return self._cluster

    def started(self, ids: Mapping[str, str]) -> None:
        """Note samplers this process started, ``{actor id: worker id or ""}`` (kept, the
        newest :data:`MAX_IDS_PER_ENTRY`; a worker id once known stays)."""
        with self._lock:
            own = self._own
            before = len(own)
            changed = False
            for sampler, worker in ids.items():
                if sampler:
                    key = sampler[:MAX_ID_CHARS]
                    if (worker and own.get(key) != worker[:MAX_ID_CHARS]) or key not in own:
                        own[key] = worker[:MAX_ID_CHARS]
                        changed = True
            while len(own) > MAX_IDS_PER_ENTRY:
                del own[next(iter(own))]
            if changed or len(own) != before:
                self._version += 1
                self._own_version += 1

    @property
    def own(self) -> dict[str, str]:
        """The samplers this process started: actor id to worker id (``""``: not known)."""
        with self._lock:
            return dict(self._own)

    def publish(self) -> bool:
        """Write this job's entry when its ids changed since the last write (after a failed
        write, again at most every ``refresh_s``); whether the entry now stands. Never raises."""
        with self._lock:
            version = self._own_version
            if version == self._written:
                return True
            failed_at = self._failed_at
            if failed_at is not None and self._clock() - failed_at < self._refresh_s:
                return False
            ids = dict(self._own)
        try:
            cluster = self._view()
            if not supports_key_value(cluster) or not cluster.is_initialized():
                return False
            job = cluster.job_id()
            if not job:
                return False
            cluster.kv_put(f"{SAMPLER_KEY_PREFIX}{job}", json.dumps(ids).encode())
        except ray_call_errors() as error:
            warn_once(
                "samplers.registry.publish",
                "could not list this driver's samplers in the cluster's key-value store "
                f"({type(error).__name__}: {printable(error)[:200]}); other processes will "
                "not believe their series (warned once)",
                logger=logger,
            )
            with self._lock:
                self._failed_at = self._clock()
            return False
        with self._lock:
            self._written, self._failed_at = version, None
        return True

    def trusted(self) -> Mapping[str, str]:
        """The ids to believe: this process's samplers and every live job's registered
        ones, the latter read again at most every ``refresh_s``; the same mapping, not to be
        changed, while none of them changed. Never raises."""
        now = self._clock()
        with self._lock:
            due = self._read_at is None or now - self._read_at >= self._refresh_s
            if due:
                self._read_at = now
        if due:
            learned = self._read()
            with self._lock:
                if learned is not None and learned != self._learned:
                    self._learned = learned
                    self._version += 1
        with self._lock:
            if self._merged[0] != self._version:
                self._merged = (self._version, {**self._learned, **self._own})
            return self._merged[1]

    def _read(self) -> dict[str, str] | None:
        """Every live job's registered ids; None when the store cannot be read (said once)."""
        try:
            cluster = self._view()
            if not supports_key_value(cluster) or not cluster.is_initialized():
                return None  # no cluster: no sampler but this process's own
            keys = sorted(cluster.kv_keys(SAMPLER_KEY_PREFIX))
            live = cluster.live_job_ids() if keys else set()
            current = [key for key in keys if key[len(SAMPLER_KEY_PREFIX) :] in live]
            raw_entries = [(key, cluster.kv_get(key)) for key in current[:MAX_JOBS_READ]]
        except ray_call_errors(None, LookupError) as error:
            warn_once(
                "samplers.registry.read",
                "could not read the samplers other drivers registered in the cluster's "
                f"key-value store ({type(error).__name__}: {printable(error)[:200]}); only "
                "the series of samplers this process started are believed (warned once)",
                logger=logger,
            )
            return None
        learned: dict[str, str] = {}
        for key, raw in raw_entries:
            try:
                learned.update(_decode(raw))
            except (TypeError, ValueError, RecursionError) as error:
                shown = printable(repr(key))[:120]
                warn_once(
                    f"samplers.registry.entry.{shown}",
                    f"ignored the samplers registered under key {shown}: {printable(error)[:200]}",
                    logger=logger,
                )
        return learned


def _decode(raw: object) -> dict[str, str]:
    if not isinstance(raw, bytes):
        raise TypeError(f"a {type(raw).__name__}, not bytes")
    if len(raw) > MAX_ENTRY_BYTES:
        raise ValueError(
            f"it takes {len(raw):,} bytes, more than the {MAX_ENTRY_BYTES:,} an entry may take"
        )
    if raw.count(b"[") + raw.count(b"{") > 1:
        raise ValueError("it nests deeper than one object of ids")
    document = json.loads(raw)
    if not isinstance(document, dict) or not all(
        isinstance(key, str)
        and isinstance(value, str)
        and 0 < len(key) <= MAX_ID_CHARS
        and len(value) <= MAX_ID_CHARS
        for key, value in document.items()
    ):
        raise ValueError(
            f"not an object of sampler ids to worker ids, each of at most {MAX_ID_CHARS} characters"
        )
    if len(document) > MAX_IDS_PER_ENTRY:
        raise ValueError(f"it lists more than {MAX_IDS_PER_ENTRY} samplers")
    return document
