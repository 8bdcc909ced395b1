"""Phases of a job, marked in the driver: ``with raylens.phase("gen"): ...``.

:class:`PhaseMarker` (:data:`DEFAULT_MARKER`) publishes the phase, begins and ends it on the
driver's process and every node's sampler, and records, logs and exports the figures.
Invariants: phases do not nest (entering one inside another, from any thread, raises
:class:`PhaseError` and leaves the running one alone), except that a phase held by a
suspended generator is ended when another begins; measuring never raises into the job
(what fails costs its own figures, logged once); the driver waits on nodes only at the
boundaries, each wait bounded (``confirm_timeout_s``, ``end_timeout_s``); an entry or exit
interrupted at any point (Ctrl-C included) leaves no phase running. Only the driver's own
process publishes and tells the samplers: in a Ray worker or a forked child a phase is
measured and recorded for that process alone (:class:`PhaseRole`).

The sequence: ``docs/architecture.md``, *Phases, in one paragraph*; what a user sees: the
README's *Memory per phase*.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, TypeVar

from raylens import forking
from raylens.cluster import ClusterView, default_cluster_view, ray_call_errors
from raylens.distributed._phase_nodes import PhaseNodes, SamplerPhaseNodes
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.phases.board import (
    clear_current_phase,
    publish_current_phase,
    publish_ended_phase,
)
from raylens.telemetry.phases.log import PhaseLog, say_phase_summary
from raylens.telemetry.phases.memory import (
    DEFAULT_TABLE,
    DRIVER_GROUP,
    NodePhaseMemory,
    NodePhaseTracker,
    PhaseMemoryTable,
    PhaseRecord,
    check_phase_name,
    kernel_peaks_from_env,
    phase_log_from_env,
)
from raylens.telemetry.procfs import ProcFS
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_CONFIRM_TIMEOUT_S",
    "DEFAULT_END_TIMEOUT_S",
    "DEFAULT_MARKER",
    "LOCAL_NODE_ID",
    "Phase",
    "PhaseError",
    "PhaseMarker",
    "PhaseNodes",
    "PhaseRole",
    "SamplerPhaseNodes",
    "configure_phases",
    "current_phase",
    "phase",
    "reset_phase_state",
]

logger = logging.getLogger("raylens.phases")

DEFAULT_CONFIRM_TIMEOUT_S = 2.0
"""How long entering a phase waits for every node to confirm it began."""
DEFAULT_END_TIMEOUT_S = 5.0
"""How long leaving a phase waits for every node's figures."""
LOCAL_NODE_ID = "local"
"""The node id the driver group is reported under when the driver is not connected to Ray."""
_NODES_QUOTED = 8
_UNSET: Any = object()


class PhaseError(RuntimeError):
    """A phase was entered while another was in progress: phases do not nest."""


class PhaseRole(enum.Enum):
    """Which process a phase is entered in, and so how far it reaches.

    Only :attr:`DRIVER` publishes the phase on the cluster's board and tells the nodes'
    samplers. In a Ray task or actor (:attr:`RAY_WORKER`) the board key would be the
    driver's (a job has one), and the samplers are the driver's to tell; in a process
    forked from one connected to Ray (:attr:`FORKED_CHILD`) the parent's GCS client is
    not the child's to use (a call through it can wait forever). Those two
    measure the phase on their own process and record and log it there, and reach
    nothing else.
    """

    DRIVER = "driver"
    RAY_WORKER = "ray_worker"
    FORKED_CHILD = "forked_child"


def _ray_role() -> PhaseRole:
    """:attr:`PhaseRole.RAY_WORKER` in a Ray task or actor, else :attr:`PhaseRole.DRIVER`.

    Reads the mode of Ray's worker in this process without any call to the cluster; a
    process that has not imported Ray is a driver (it has nothing to publish to).
    """
    worker_module = sys.modules.get("ray._private.worker")
    if worker_module is None:
        return PhaseRole.DRIVER
    try:
        mode = worker_module.global_worker.mode
        worker_mode = worker_module.WORKER_MODE
    except AttributeError:
        return PhaseRole.DRIVER
    return PhaseRole.RAY_WORKER if mode is not None and mode == worker_mode else PhaseRole.DRIVER


def _ray_connected() -> bool:
    """Whether Ray in this process is connected, read without calling into Ray's client."""
    ray = sys.modules.get("ray")
    try:
        return ray is not None and bool(ray.is_initialized())
    except ray_call_errors(ray, AttributeError):  # a stub or half-imported module
        return False


_T = TypeVar("_T")


def _for_the_caller(action: Callable[[], _T], report: Callable[[Exception], None]) -> _T | None:
    """``action()``, or None once ``report`` has been told why it failed.

    Marking a phase never fails the caller's code: Ray, the key-value store, ``/proc``
    and the phase log failing cost only that phase's figures.
    """
    try:
        return action()
    except Exception as error:  # noqa: BLE001 the caller's code goes on
        report(error)
        return None


def _debug_unrecorded(_error: Exception) -> None:
    logger.debug("could not record the suspended phase", exc_info=True)


def _suspended(frame: FrameType | None) -> bool:
    """Whether ``frame`` is a generator's that no thread is running: suspended at a yield.

    A phase entered in a generator lasts until the generator is resumed past its block,
    which may be never; coroutines are left out (an event loop resumes them).
    """
    if frame is None or not frame.f_code.co_flags & inspect.CO_GENERATOR:
        return False
    for top in sys._current_frames().values():
        walked: FrameType | None = top
        while walked is not None:
            if walked is frame:
                return False
            walked = walked.f_back
    return True


def _ray_node_id() -> str:
    """This driver's Ray node id, or :data:`LOCAL_NODE_ID` when Ray is not connected."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return LOCAL_NODE_ID
    node_id = ray.get_runtime_context().get_node_id()
    return node_id if isinstance(node_id, str) and node_id else LOCAL_NODE_ID


@dataclass
class _Running:
    phase: str
    token: str
    started: float
    started_wall: float
    missing: tuple[str, ...] = ()
    #: The frame whose ``with`` block holds the phase (None when entered by a call).
    holder: FrameType | None = None
    #: Entered outside the driver's own process: measured here, published nowhere.
    local: bool = False


class Phase(contextlib.ContextDecorator):
    """One phase name of a :class:`PhaseMarker`: a context manager, and a decorator.

    As a decorator each call of the function is one run of the phase; a call while another
    phase is in progress (a recursive call included) raises :class:`PhaseError`.
    """

    def __init__(self, marker: PhaseMarker, name: str) -> None:
        self._marker = marker
        self.name = check_phase_name(name)
        self._tokens: list[str] = []

    def __enter__(self) -> Phase:
        self._tokens.append(self._marker.enter(self.name, holder=sys._getframe(1)))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        token = self._tokens.pop() if self._tokens else None
        self._marker.leave(self.name, token)

    def __repr__(self) -> str:
        return f"Phase({self.name!r})"


class PhaseMarker:
    """The driver's phases: where they are published, measured, recorded and logged.

    ``nodes`` reaches the samplers (default :class:`SamplerPhaseNodes` over the driver's);
    ``cluster`` is where the current phase is published (default: the connected cluster,
    looked up at each phase); ``table`` receives every phase's figures (default
    :data:`~raylens.telemetry.phases.memory.DEFAULT_TABLE`); ``procfs`` reads the driver's own
    process. ``kernel_peaks`` (default ``RAYLENS_KERNEL_PEAKS``, else on) and ``log_path``
    (default ``RAYLENS_PHASE_LOG``, else none) are the settings, read at each phase's start
    when not given; :meth:`configure` changes them. ``clock`` times phases,
    ``wall_clock`` stamps them; ``driver_node_id`` says which node the driver runs on;
    ``role`` says which process this is (default: a Ray worker when Ray runs this process
    as one, else the driver; a process forked from one connected to Ray is a forked child
    whatever ``role`` says).
    """

    def __init__(
        self,
        *,
        nodes: PhaseNodes | None = None,
        cluster: ClusterView | None = None,
        table: PhaseMemoryTable | None = None,
        procfs: ProcFS | None = None,
        kernel_peaks: bool | None = None,
        log_path: str | os.PathLike[str] | None = None,
        confirm_timeout_s: float = DEFAULT_CONFIRM_TIMEOUT_S,
        end_timeout_s: float = DEFAULT_END_TIMEOUT_S,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
        driver_node_id: Callable[[], str] | None = None,
        environ: Mapping[str, str] | None = None,
        role: Callable[[], PhaseRole] | None = None,
    ) -> None:
        self.nodes: PhaseNodes = nodes if nodes is not None else SamplerPhaseNodes()
        self._cluster = cluster
        self.table = table if table is not None else DEFAULT_TABLE
        self._procfs = procfs
        self._clock = clock or time.monotonic
        self._wall_clock = wall_clock or time.time
        self._driver_node_id = driver_node_id or _ray_node_id
        self._node_id_seen: str | None = None
        self._role = role or _ray_role
        self._owner_pid = os.getpid()
        self._forked = False
        self._environ = environ
        self.kernel_peaks: bool | None = None
        self.log_path: str | None = None
        self.confirm_timeout_s = DEFAULT_CONFIRM_TIMEOUT_S
        self.end_timeout_s = DEFAULT_END_TIMEOUT_S
        self.configure(
            kernel_peaks=kernel_peaks,
            log_path=log_path,
            confirm_timeout_s=confirm_timeout_s,
            end_timeout_s=end_timeout_s,
        )
        self._lock = threading.Lock()
        self._running: _Running | None = None
        self._driver: NodePhaseTracker | None = None
        self._phase_log: PhaseLog | None = None
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock and no phase (the parent's is the parent's). A
        child of a parent connected to Ray keeps its phases local from now on (the Ray
        client it inherited is the parent's); a child of an unconnected parent owns the
        marker, and may connect to Ray and publish as a driver of its own."""
        self._lock = threading.Lock()
        self._running = None
        self._driver = None
        self._phase_log = None  # the parent's file stays the parent's to close
        if _ray_connected():
            self._forked = True
        else:
            self._owner_pid = os.getpid()

    def role(self) -> PhaseRole:
        """Which process this is, for phases entered now (see :class:`PhaseRole`)."""
        if self._forked or os.getpid() != self._owner_pid:
            return PhaseRole.FORKED_CHILD
        return self._role()

    def configure(
        self,
        *,
        kernel_peaks: bool | None = _UNSET,
        log_path: str | os.PathLike[str] | None = _UNSET,
        confirm_timeout_s: float | None = None,
        end_timeout_s: float | None = None,
    ) -> None:
        """Change the settings given; None for ``kernel_peaks`` or ``log_path`` means "from the
        environment". Raises TypeError or ValueError naming a bad value; nothing changes then."""
        if kernel_peaks not in (_UNSET, None) and not isinstance(kernel_peaks, bool):
            raise TypeError(f"kernel_peaks must be a bool or None, got {kernel_peaks!r:.80}")
        if log_path is not _UNSET and log_path is not None:
            log_path = os.fspath(log_path)
            if not isinstance(log_path, str) or not log_path:
                raise ValueError(f"log_path must be a non-empty path or None, got {log_path!r:.80}")
        confirm = (
            None
            if confirm_timeout_s is None
            else positive_seconds("confirm_timeout_s", confirm_timeout_s)
        )
        end = None if end_timeout_s is None else positive_seconds("end_timeout_s", end_timeout_s)
        if kernel_peaks is not _UNSET:
            self.kernel_peaks = kernel_peaks
        if log_path is not _UNSET:
            self.log_path = None if log_path is None else str(log_path)
        if confirm is not None:
            self.confirm_timeout_s = confirm
        if end is not None:
            self.end_timeout_s = end

    def phase(self, name: str) -> Phase:
        """A context manager and decorator marking phase ``name``; TypeError or ValueError
        for a bad name (a non-empty str of at most 128 printable characters)."""
        return Phase(self, name)

    def current_phase(self) -> str | None:
        """The name of the phase in progress in this driver, or None."""
        running = self._running
        return None if running is None else running.phase

    def current_started(self) -> tuple[str, float] | None:
        """The phase in progress in this driver and when it began (Unix time), or None."""
        running = self._running
        return None if running is None else (running.phase, running.started_wall)

    # entering and leaving --------------------------------------------------------------

    def enter(self, name: str, *, holder: FrameType | None = None) -> str:
        """Begin phase ``name`` (see the module docstring) and return its token; PhaseError
        inside another phase. ``holder`` is the frame whose block holds the phase: when it
        is a generator's, suspended, the phase it holds is ended and this one begins."""
        name = check_phase_name(name)
        local = self.role() is not PhaseRole.DRIVER
        running = _Running(
            name, uuid.uuid4().hex, self._clock(), self._wall_clock(), holder=holder, local=local
        )
        begun = False
        try:
            stale = self._claim(running)

            def warn(error: Exception) -> None:
                warn_once(
                    "phases.begin",
                    f"phase {printable(name)!r}: could not tell every node it began "
                    f"({type(error).__name__}: {printable(error)[:200]}); its figures may be "
                    "incomplete (warned once)",
                    logger=logger,
                )

            missing = _for_the_caller(lambda: self._tell_begun(running, stale), warn) or []
            running.missing = tuple(missing)
            if missing:
                logger.warning(
                    "phase %r: %s did not confirm its start within %g s; their figures for "
                    "it may miss its first moments",
                    printable(name),
                    _quoted_nodes(missing),
                    self.confirm_timeout_s,
                )
            begun = True
        finally:
            if not begun:
                # Interrupted (Ctrl-C) or refused: a phase this call claimed must not stay marked.
                self._abort(running)
        return running.token

    def _tell_begun(self, running: _Running, stale: _Running | None) -> list[str]:
        """End ``stale``, start measuring ``running`` here and on every node; the nodes that
        did not confirm."""
        if stale is not None:
            self._end_stale(stale, running.phase)
        kernel = self._kernel_peaks()
        if not running.local:
            self._publish(running.phase, running.started_wall)
        self._driver_tracker().begin(running.token, self._driver_workers(), kernel_peaks=kernel)
        if running.local:
            return []
        _, missing = self.nodes.begin(running.token, kernel, self.confirm_timeout_s)
        return missing

    def _claim(self, running: _Running) -> _Running | None:
        """Mark ``running`` as the phase in progress; the phase it displaces (one held by a
        suspended generator), or None. PhaseError when a live phase is in progress."""
        with self._lock:
            current = self._running
            if current is not None and not _suspended(current.holder):
                raise PhaseError(
                    f"phase {printable(running.phase)!r} cannot begin inside phase "
                    f"{printable(current.phase)!r}: phases do not nest; end "
                    f"{printable(current.phase)!r} first"
                )
            self._running = running
        return current

    def _end_stale(self, stale: _Running, successor: str) -> None:
        warn_once(
            "phases.suspended",
            f"phase {printable(stale.phase)!r} was held by a suspended generator when phase "
            f"{printable(successor)!r} began: it was ended there (warned once)",
            logger=logger,
        )
        _for_the_caller(lambda: self._finish(stale), _debug_unrecorded)

    def _abort(self, running: _Running) -> None:
        """Undo an entry that did not complete: no phase left running, nothing published."""
        with self._lock:
            if self._running is not running:
                return
            self._running = None
        with contextlib.suppress(Exception):
            if self._driver is not None:
                self._driver.cancel()
        if not running.local:
            self._publish(None, 0.0)

    def leave(self, name: str, token: str | None = None) -> PhaseRecord | None:
        """End phase ``name`` and record it; None (and nothing done) if it is not in progress
        (or, with ``token``, if the phase in progress is another run of that name)."""
        running = self._running
        if running is None or running.phase != name:
            return None
        if token is not None and running.token != token:
            return None

        def warn(error: Exception) -> None:
            warn_once(
                "phases.end",
                f"phase {printable(name)!r}: could not collect its figures "
                f"({type(error).__name__}: {printable(error)[:200]}); warned once",
                logger=logger,
            )

        try:
            return _for_the_caller(lambda: self._finish(running), warn)
        finally:
            with self._lock:
                if self._running is running:
                    self._running = None
            if not running.local:
                self._publish(None, 0.0)

    def _finish(self, running: _Running) -> PhaseRecord:
        duration = max(0.0, self._clock() - running.started)
        nodes, unanswered = (
            ({}, []) if running.local else self.nodes.end(running.token, self.end_timeout_s)
        )
        figures = dict(nodes)
        driver = self._driver_tracker().end(running.token)
        if driver is not None and driver.groups:
            node_id = self._node_id(running.local)
            here = figures.get(node_id)
            if here is None:
                figures[node_id] = driver
            else:  # the driver's node hosts workers too: one row more on it
                groups = tuple(sorted(here.groups + driver.groups, key=lambda g: g.group))
                figures[node_id] = NodePhaseMemory(here.host_name, groups)
        missing = tuple(sorted(set(unanswered) | (set(running.missing) - set(figures))))
        record = PhaseRecord(
            running.phase,
            duration_s=duration,
            ended_at=self._wall_clock(),
            nodes=figures,
            missing=missing,
        )
        self.table.record(record)
        say_phase_summary(record)
        if not running.local:
            self._publish_ended(record)
        log = self._log()
        if log is not None:
            log.append(record)
        return record

    # settings and seams -----------------------------------------------------------------

    def _kernel_peaks(self) -> bool:
        if self.kernel_peaks is not None:
            return self.kernel_peaks
        try:
            return kernel_peaks_from_env(self._environ)
        except ValueError as error:
            warn_once(
                "phases.kernel_peaks_env",
                f"{error}; kernel peaks stay on (warned once)",
                logger=logger,
            )
            return True

    def _node_id(self, local: bool) -> str:
        """The node this process runs on; in a forked child, what the parent learnt (the
        child never calls into the parent's Ray)."""
        if local and self.role() is PhaseRole.FORKED_CHILD:
            return self._node_id_seen or LOCAL_NODE_ID
        node_id = self._node_id_seen = self._driver_node_id()
        return node_id

    def _log(self) -> PhaseLog | None:
        """The log of the path now configured, kept open from phase to phase."""
        path = self._log_path()
        log = self._phase_log
        if log is not None and (path is None or log.path != path):
            log.close()
            log = self._phase_log = None
        if path is not None and log is None:
            log = self._phase_log = PhaseLog(path)
        return log

    def _log_path(self) -> str | None:
        if self.log_path is not None:
            return self.log_path
        return phase_log_from_env(self._environ)

    def _driver_tracker(self) -> NodePhaseTracker:
        if self._driver is None:
            self._driver = NodePhaseTracker(self._procfs, walk_trees=False)
        return self._driver

    def _driver_workers(self) -> list[tuple[str, int, int | None]]:
        procfs = self._procfs if self._procfs is not None else ProcFS()
        pid = os.getpid()
        return [(DRIVER_GROUP, pid, procfs.start_ticks(pid))]

    def _publish(self, name: str | None, started_at: float) -> None:
        view = self._cluster if self._cluster is not None else default_cluster_view()
        if name is None:
            clear_current_phase(view)
        else:
            publish_current_phase(view, name, started_at)

    def _publish_ended(self, record: PhaseRecord) -> None:
        view = self._cluster if self._cluster is not None else default_cluster_view()
        publish_ended_phase(view, record)

    def reset(self) -> None:
        """Forget the phase in progress without measuring it (tests)."""
        with self._lock:
            self._running = None
        if self._driver is not None:
            self._driver.cancel()


def _quoted_nodes(nodes: list[str]) -> str:
    shown = ", ".join(printable(node[:56]) for node in nodes[:_NODES_QUOTED])
    more = f" and {len(nodes) - _NODES_QUOTED} more" if len(nodes) > _NODES_QUOTED else ""
    return f"node(s) {shown}{more}"


DEFAULT_MARKER = PhaseMarker()
"""The driver's phases: what :func:`phase`, :func:`current_phase` and :func:`configure_phases` use."""


def phase(name: str) -> Phase:
    """:meth:`PhaseMarker.phase` on :data:`DEFAULT_MARKER`: ``with phase("gen"): ...``."""
    return DEFAULT_MARKER.phase(name)


def current_phase() -> str | None:
    """The name of the driver's phase in progress, or None (:data:`DEFAULT_MARKER`)."""
    return DEFAULT_MARKER.current_phase()


def configure_phases(
    *,
    kernel_peaks: bool | None = _UNSET,
    log_path: str | os.PathLike[str] | None = _UNSET,
    confirm_timeout_s: float | None = None,
    end_timeout_s: float | None = None,
) -> None:
    """:meth:`PhaseMarker.configure` on :data:`DEFAULT_MARKER`."""
    DEFAULT_MARKER.configure(
        kernel_peaks=kernel_peaks,
        log_path=log_path,
        confirm_timeout_s=confirm_timeout_s,
        end_timeout_s=end_timeout_s,
    )


def reset_phase_state() -> None:
    """Return :data:`DEFAULT_MARKER` to no phase and its settings to the environment's (tests)."""
    DEFAULT_MARKER.reset()
    DEFAULT_MARKER.configure(
        kernel_peaks=None,
        log_path=None,
        confirm_timeout_s=DEFAULT_CONFIRM_TIMEOUT_S,
        end_timeout_s=DEFAULT_END_TIMEOUT_S,
    )
