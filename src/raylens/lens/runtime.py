"""The process's one telemetry pipeline: start it, reach it, stop it.

Invariants a maintainer must keep:

- the ``MeterProvider`` is private, never the global one;
- a gauge declaration outlives any one pipeline, and nothing creates an instrument
  before a pipeline runs;
- attribute sets idle for :data:`IDLE_COLLECTIONS` collections are dropped from the
  SDK's state, live ones never;
- :func:`shutdown_telemetry` exports one last time before it runs the shutdown hooks.

State: the current handle, the gauge declarations and the shutdown hooks
(``docs/architecture.md``, *State, and the one reset*); the rest of the design:
its *``raylens.lens``* section.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.metrics import (
    CallbackOptions,
    Meter,
    ObservableGauge,
    Observation,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from raylens import forking
from raylens.lens import _sdk_state
from raylens.lens._live_sets import LiveAttributeSets, exportable
from raylens.lens.config import TelemetryConfig
from raylens.lens.exporters import PrometheusEndpoint, build_exporter_reader
from raylens.lens.metrics import (
    OBSERVABLE_COUNTER,
    OBSERVABLE_GAUGE,
    RecordedMetric,
    register_recorded_metrics,
)
from raylens.lens.warnings import call_or_warn_once, warn_once
from raylens.safe_text import encodable
from raylens.version import __version__

logger = logging.getLogger("raylens.lens")


METER_NAME = "raylens"
CARDINALITY_LIMIT = 200_000
# Collections in a row an attribute set may go unreported before the SDK forgets it.
IDLE_COLLECTIONS = 2

ObservableCallback = Callable[[CallbackOptions], Iterable[Observation]]


@dataclass
class TelemetryHandle:
    """The running pipeline: its meter, its configuration, and what it exports to."""

    config: TelemetryConfig
    meter_provider: MeterProvider | None
    meter: Meter
    readers: list[MetricReader] = field(default_factory=list)
    exporter_reader: MetricReader | None = None
    prometheus: PrometheusEndpoint | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _gauges: dict[str, ObservableGauge] = field(default_factory=dict, repr=False)
    #: Makes a fresh reader of the same kind, for :func:`renew_pipeline`; None when the
    #: reader came from outside lens (it cannot be made again).
    _renew_reader: Callable[[], MetricReader] | None = field(default=None, repr=False)
    _callbacks: list[_GaugeCallback] = field(default_factory=list, repr=False)

    @property
    def is_exporting(self) -> bool:
        """True when points leave the process: telemetry on and a reader attached."""
        return self.meter_provider is not None and bool(self.readers)

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        if self.meter_provider is None:
            return True
        return self.meter_provider.force_flush(timeout_ms)

    def held_attribute_sets(self, name: str) -> int:
        """How many attribute sets the SDK holds for gauge ``name`` (0 when not exporting).

        Bounded by the sets reported in the last :data:`IDLE_COLLECTIONS` collections.
        """
        instrument = self._gauges.get(name)
        if instrument is None or self.meter_provider is None:
            return 0
        return _sdk_state.held_attribute_sets(instrument)


_HANDLE: TelemetryHandle | None = None
_HANDLE_LOCK = threading.RLock()
forking.renew_lock_in_child(sys.modules[__name__], "_HANDLE_LOCK", threading.RLock)

_OBSERVABLES: dict[str, tuple[RecordedMetric, ObservableCallback]] = {}
#: Gauges whose callbacks return attributes made encodable where they entered raylens.
_ENCODABLE: set[str] = set()
_CREATED_ON: dict[str, int] = {}


#: Gone attribute sets a gauge may leave in the SDK, where they cannot be dropped one by
#: one, before lens renews the pipeline to let go of them (see :func:`renew_pipeline`).
RENEW_AFTER_UNRELEASED = 4096


class _GaugeCallback:
    """The callback the SDK calls for one lens gauge on one pipeline.

    Looks the current user callback up (so re-registering replaces it), never
    raises, makes every observation exportable (unless the gauge was declared with
    ``attributes_encodable``), and after each collection drops
    from the SDK the attribute sets that have gone unreported for
    :data:`IDLE_COLLECTIONS` collections. Where the SDK's state cannot be reached,
    those sets are counted instead, and past :data:`RENEW_AFTER_UNRELEASED` the
    pipeline is renewed. A retired callback (of a renewed pipeline) reports nothing.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.live = LiveAttributeSets(IDLE_COLLECTIONS)
        self.instrument: ObservableGauge | None = None
        self.unreleased = 0
        self.retired = False

    def attach(self, instrument: ObservableGauge) -> None:
        """Start pruning ``instrument``'s SDK state, when the SDK's layout allows it."""
        gap = _sdk_state.layout_gap(instrument)
        if gap is None:
            self.instrument = instrument
        else:
            warn_once(
                "lens.sdk_state.unsupported",
                f"this opentelemetry-sdk has no {gap}; lens lets go of attribute sets that "
                "are gone by renewing its pipeline now and then instead",
            )

    def __call__(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.retired:
            return []
        entry = _OBSERVABLES.get(self.name)
        observations: list[Observation] = []
        if entry is not None:
            callback = entry[1]
            encodable = self.name in _ENCODABLE
            # Any caller's callback: its failure costs only its own points.
            _, found = call_or_warn_once(
                lambda: (
                    list(callback(options))
                    if encodable
                    else [exportable(o) for o in callback(options)]
                ),
                f"lens.callback.{self.name}",
                f"callback for gauge {self.name!r} failed; no points",
            )
            observations = found or []
        self._release(self.live.collected(observations))
        return observations

    def _release(self, expired: list[Mapping[str, AttributeValue]]) -> None:
        if not expired:
            return
        if self.instrument is None:
            self.unreleased += len(expired)
            if self.unreleased >= RENEW_AFTER_UNRELEASED:
                self.unreleased = 0
                _request_renewal()
            return
        instrument = self.instrument
        # SDK internals differ by release; any failure means renew instead.
        released, _ = call_or_warn_once(
            lambda: _sdk_state.forget_attribute_sets(instrument, expired),
            "lens.sdk_state.forget",
            f"could not release expired attribute sets of gauge {self.name!r}; "
            "lens renews its pipeline now and then instead",
        )
        if not released:
            self.instrument = None


_RENEWAL_LOCK = threading.Lock()
_RENEWAL: threading.Thread | None = None
forking.renew_lock_in_child(sys.modules[__name__], "_RENEWAL_LOCK")


def _request_renewal() -> None:
    """Renew the pipeline on a thread of its own: a callback runs inside a collection."""
    global _RENEWAL
    with _RENEWAL_LOCK:
        if _RENEWAL is not None and _RENEWAL.is_alive():
            return
        _RENEWAL = threading.Thread(target=renew_pipeline, name="raylens-lens-renew", daemon=True)
        _RENEWAL.start()


def renewal_thread() -> threading.Thread | None:
    """The latest renewal started by a gauge, running or done (tests wait on it)."""
    return _RENEWAL


def renew_pipeline() -> bool:
    """Move the running pipeline to a fresh meter provider, through public API only.

    The SDK keeps every attribute set an instrument has seen for as long as its
    provider lives; where lens cannot drop gone ones from its state, a new provider
    with a new reader of the same kind holds only what is live. Gauges read their
    callbacks' state, so their next points are what they would have been; the old
    provider's last export reports no gauge points. The handle stays the same
    object. Returns False (nothing done) without a pipeline, or when its reader came
    from outside lens.
    """
    with _HANDLE_LOCK:
        handle = _HANDLE
        if handle is None or handle._renew_reader is None or handle.meter_provider is None:
            return False
        reader = handle._renew_reader()
        old = handle.meter_provider
        for callback in handle._callbacks:
            callback.retired = True
        handle._callbacks.clear()
        handle._gauges.clear()
        for name in [name for name, owner in _CREATED_ON.items() if owner == id(handle)]:
            del _CREATED_ON[name]
        handle.meter_provider = _new_provider(handle.config, reader)
        handle.meter = handle.meter_provider.get_meter(METER_NAME, __version__)
        handle.readers = [reader]
        handle.exporter_reader = reader
        _create_observables(handle)
    call_or_warn_once(
        lambda: old.shutdown(timeout_millis=5000),
        "lens.renew.shutdown",
        "shutting the previous meter provider down failed",
    )
    return True


def _create_observables(handle: TelemetryHandle) -> None:
    for name, (metric, _callback) in list(_OBSERVABLES.items()):
        if _CREATED_ON.get(name) == id(handle):
            continue
        callback = _GaugeCallback(name)
        handle._callbacks.append(callback)
        if metric.kind == OBSERVABLE_COUNTER:
            # A counter's sets are cumulative: its SDK state is kept, and what its callback
            # reports is bounded by whoever holds the counts.
            handle.meter.create_observable_counter(
                metric.name,
                callbacks=[callback],
                unit=metric.unit,
                description=metric.description,
            )
            _CREATED_ON[name] = id(handle)
            continue
        instrument = handle.meter.create_observable_gauge(
            metric.name,
            callbacks=[callback],
            unit=metric.unit,
            description=metric.description,
        )
        if handle.meter_provider is not None:
            callback.attach(instrument)
        handle._gauges[name] = instrument
        _CREATED_ON[name] = id(handle)


def register_observable_gauge(
    metric: RecordedMetric, callback: ObservableCallback, *, attributes_encodable: bool = False
) -> None:
    """Export ``metric`` as an observable gauge whose points ``callback`` returns.

    ``callback`` must read state prepared elsewhere (no I/O); an exception inside
    it is logged once and costs that collection its points, never the SDK's loop.
    Registering the same name again replaces the callback. Every point's attributes
    are made encodable, unless ``attributes_encodable`` says the callback only returns
    text that was made encodable where it entered (the check then costs nothing).
    """
    _register_observable(metric, callback, OBSERVABLE_GAUGE, attributes_encodable)


def _register_observable(
    metric: RecordedMetric,
    callback: ObservableCallback,
    kind: str,
    attributes_encodable: bool = False,
) -> None:
    if metric.kind != kind:
        raise ValueError(f"metric {metric.name!r} has kind {metric.kind!r}, not {kind!r}")
    register_recorded_metrics([metric])
    with _HANDLE_LOCK:
        _OBSERVABLES[metric.name] = (metric, callback)
        if attributes_encodable:
            _ENCODABLE.add(metric.name)
        else:
            _ENCODABLE.discard(metric.name)
        if _HANDLE is not None:
            _create_observables(_HANDLE)


def register_observable_counter(metric: RecordedMetric, callback: ObservableCallback) -> None:
    """Export ``metric`` as an observable (monotonic, cumulative) counter read by ``callback``.

    As :func:`register_observable_gauge`, for a count that only grows: ``callback``
    returns each attribute set's running total, read from state kept elsewhere.
    """
    _register_observable(metric, callback, OBSERVABLE_COUNTER)


def declared_observables() -> frozenset[str]:
    """The names of every gauge and observable counter declared now (with a callback)."""
    with _HANDLE_LOCK:
        return frozenset(_OBSERVABLES)


def unregister_observable_gauge(name: str) -> None:
    """Stop reporting ``name``: its instrument stays on the current meter but yields no points."""
    with _HANDLE_LOCK:
        _OBSERVABLES.pop(name, None)
        _ENCODABLE.discard(name)


def reset_observable_gauges() -> None:
    """Forget every gauge declaration (tests only)."""
    with _HANDLE_LOCK:
        _OBSERVABLES.clear()
        _ENCODABLE.clear()
        _CREATED_ON.clear()


def init_telemetry(
    config: TelemetryConfig | None = None, *, metric_reader: MetricReader | None = None
) -> TelemetryHandle:
    """Start this process's pipeline, or return the one already running.

    ``config`` defaults to :meth:`TelemetryConfig.from_env`. A ``metric_reader``
    replaces the configured exporter (tests pass an in-memory reader this way).
    With telemetry off and no reader, instruments are no-ops and nothing exports.
    """
    global _HANDLE
    with _HANDLE_LOCK:
        if _HANDLE is not None:
            return _HANDLE
        config = config if config is not None else TelemetryConfig.from_env()
        closers: list[Callable[[], None]] = []
        prometheus = None
        reader: MetricReader | None
        if metric_reader is not None:
            reader = metric_reader
        elif config.enabled:
            reader, closer, prometheus = build_exporter_reader(config)
            if closer is not None:
                closers.append(closer)
        else:
            reader = None

        if reader is None:
            from opentelemetry.metrics import NoOpMeterProvider

            handle = TelemetryHandle(
                config=config,
                meter_provider=None,
                meter=NoOpMeterProvider().get_meter(METER_NAME),
            )
        else:
            provider = _new_provider(config, reader)
            _register_exit_flush()
            handle = TelemetryHandle(
                config=config,
                meter_provider=provider,
                meter=provider.get_meter(METER_NAME, __version__),
                readers=[reader],
                exporter_reader=None if metric_reader is not None else reader,
                prometheus=prometheus,
                _closers=closers,
                _renew_reader=None
                if metric_reader is not None
                else _reader_maker(config, prometheus),
            )
        _HANDLE = handle
        _create_observables(handle)
        return handle


def _new_provider(config: TelemetryConfig, reader: MetricReader) -> MeterProvider:
    """A private meter provider for ``config`` that exports through ``reader``."""
    # A configuration built in code skips from_env's clean-up; text that does not
    # encode would make every export of the resource fail.
    attributes: dict[str, AttributeValue] = {
        encodable(str(key)): encodable(value) if isinstance(value, str) else value
        for key, value in config.resource_attributes.items()
    }
    attributes["service.name"] = encodable(config.service_name)
    view, problem = _sdk_state.cardinality_view(CARDINALITY_LIMIT)
    if problem is not None:
        warn_once("lens.sdk_state.cardinality", problem)
    return MeterProvider(
        metric_readers=[reader],
        resource=Resource.create(attributes),
        views=[view],
        shutdown_on_exit=False,
    )


def _reader_maker(
    config: TelemetryConfig, prometheus: PrometheusEndpoint | None
) -> Callable[[], MetricReader]:
    """How :func:`renew_pipeline` makes a reader like the one ``config`` gave."""
    if prometheus is not None:
        return prometheus.renew_reader

    def make() -> MetricReader:
        reader, _closer, _endpoint = build_exporter_reader(config)
        assert reader is not None  # only called for a pipeline that had one
        return reader

    return make


#: The pid that registered the exit hook: a forked child inherits the hook, not the duty.
_EXIT_FLUSH_PID: int | None = None


def _register_exit_flush() -> None:
    """Flush and stop the pipeline at interpreter exit, once per process.

    The SDK's own exit hook is turned off: it holds every provider ever made and
    complains at exit about the ones :func:`shutdown_telemetry` already stopped.
    A forked child inherits the parent's registration but not its pipeline's
    threads and locks, so the hook does nothing in a child unless the child
    starts telemetry of its own.
    """
    global _EXIT_FLUSH_PID
    if os.getpid() != _EXIT_FLUSH_PID:
        _EXIT_FLUSH_PID = os.getpid()
        atexit.register(_flush_at_exit, _EXIT_FLUSH_PID)


def _forget_parents_pipeline() -> None:
    """In a forked child: the parent's pipeline, hooks and instruments are not this process's.

    The child starts with no telemetry of its own; :func:`init_telemetry` there builds a
    new pipeline and registers an exit flush for the child.
    """
    global _HANDLE
    _HANDLE = None
    _SHUTDOWN_HOOKS.clear()
    _CREATED_ON.clear()


forking.call_in_child(_forget_parents_pipeline)


def _flush_at_exit(registered_by: int) -> None:
    if os.getpid() == registered_by:
        shutdown_telemetry()


def get_telemetry_handle() -> TelemetryHandle | None:
    """The running pipeline, or None before :func:`init_telemetry`."""
    return _HANDLE


_SHUTDOWN_HOOKS: list[Callable[[], None]] = []


def add_shutdown_hook(hook: Callable[[], None]) -> None:
    """Call ``hook`` at the next :func:`shutdown_telemetry`, after the final export.

    For work started alongside the pipeline (a monitor whose gauges it exports)
    that must stop with it: the last export still reads what that work published,
    and the work stops right after it. Hooks run newest first, once each, and are then
    forgotten; adding the same hook twice before a shutdown runs it once. A hook
    that raises is logged and does not keep the others or the flush from running.
    """
    if not callable(hook):
        raise TypeError(f"shutdown hook must be callable, got {hook!r}")
    with _HANDLE_LOCK:
        if hook not in _SHUTDOWN_HOOKS:
            _SHUTDOWN_HOOKS.append(hook)


def remove_shutdown_hook(hook: Callable[[], None]) -> None:
    """Forget ``hook`` if it was added and has not run yet."""
    with _HANDLE_LOCK:
        if hook in _SHUTDOWN_HOOKS:
            _SHUTDOWN_HOOKS.remove(hook)


def _run_shutdown_hooks() -> None:
    with _HANDLE_LOCK:
        hooks = list(reversed(_SHUTDOWN_HOOKS))
        _SHUTDOWN_HOOKS.clear()
    for hook in hooks:
        # Any layer's hook: one that fails must not keep the next from running.
        name = getattr(hook, "__qualname__", type(hook).__name__)
        call_or_warn_once(hook, f"lens.shutdown.hook.{name}", f"shutdown hook {name} failed")


def shutdown_telemetry(timeout_ms: int = 5000) -> None:
    """Export one last time, stop the pipeline, then run the shutdown hooks.

    The final export comes first, while the work the hooks stop (the host-memory
    monitor) still publishes: stopping that work first would leave the last export
    without its points. Never raises; always leaves lens uninitialised.
    """
    global _HANDLE
    with _HANDLE_LOCK:
        handle, _HANDLE = _HANDLE, None
        _CREATED_ON.clear()
    try:
        if handle is not None:
            _stop_pipeline(handle, timeout_ms)
    finally:
        _run_shutdown_hooks()


def _stop_pipeline(handle: TelemetryHandle, timeout_ms: int) -> None:
    """Shut the provider down (its readers' final collection and export), then the endpoints.

    A handle installed from outside may carry only a ``meter`` (as NeMo-Gym's tests
    install one): what it lacks is not stopped, since lens did not start it.
    """
    provider = getattr(handle, "meter_provider", None)
    if provider is not None:
        call_or_warn_once(
            lambda: provider.shutdown(timeout_millis=timeout_ms),
            "lens.shutdown.provider",
            "shutting the meter provider down failed",
        )
    for closer in getattr(handle, "_closers", ()):
        call_or_warn_once(closer, "lens.shutdown.closer", "closing an exporter endpoint failed")
