"""How ``raylens watch`` notices, shows and gives up on a cluster that stopped answering.

Once the GCS is gone, every Ray call that reaches it (``ray.nodes()``, the key-value
store) blocks until Ray's own client ends the whole process, about a minute later. So
the watch never makes such a call blindly: each cycle first opens a TCP connection to
the GCS under a short deadline, and while that fails no GCS call is made at all; a
call that is made runs on a daemon thread and is abandoned at its own deadline.

Invariants a caller may rely on:

- A GCS call through :class:`GuardedCluster` never blocks its caller longer than
  ``call_timeout``; :meth:`GuardedCluster.check` is as bounded as the probe it was given.
- "Unreachable since" is the last moment the cluster answered, so the give-up time
  is counted from the earliest the cluster can have gone away.
- While unreachable, every GCS call raises :class:`ClusterUnreachable` at once.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol, TypeVar

from raylens.cluster import KeyValueClusterView
from raylens.safe_text import printable

__all__ = [
    "DEFAULT_GIVE_UP_S",
    "ClusterUnreachable",
    "GuardedCluster",
    "ray_reconnect_setting",
    "run_bounded",
    "tcp_probe",
]

T = TypeVar("T")

#: Seconds without an answer after which ``raylens watch`` exits (``--give-up``).
DEFAULT_GIVE_UP_S = 30.0
#: Ray's client ends a process whose GCS has not answered for this long (Ray's
#: default ``gcs_rpc_server_reconnect_timeout_s``); the watch must give up first.
RAY_RECONNECT_TIMEOUT_S = 60.0
#: Set in the watch's own environment, before ``ray.init``, to move Ray's limit.
RAY_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
# How long after giving up Ray's limit falls: room for the watch to stop and disconnect.
_RECONNECT_MARGIN_S = 30.0


def ray_reconnect_setting(give_up: float, environ: Mapping[str, str]) -> str | None:
    """The value to give :data:`RAY_RECONNECT_ENV` so that Ray outwaits ``give_up``; None if none.

    Ray's default already leaves room for ``give_up`` up to half a minute; a longer
    one needs Ray's limit moved, unless the user set it themselves.
    """
    if RAY_RECONNECT_ENV in environ or give_up + _RECONNECT_MARGIN_S <= RAY_RECONNECT_TIMEOUT_S:
        return None
    return str(math.ceil(give_up + _RECONNECT_MARGIN_S))


class BoundedRunner(Protocol):
    """Runs one call under a deadline: its result, its exception, or TimeoutError."""

    def __call__(self, call: Callable[[], T], timeout: float) -> T: ...


class ClusterUnreachable(ConnectionError):
    """The cluster's GCS did not answer: the call was not made, or was abandoned."""


def tcp_probe(host: str, port: int, timeout: float) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def run_bounded(call: Callable[[], T], timeout: float) -> T:
    """``call()`` on a daemon thread; its result, its exception, or TimeoutError past ``timeout``.

    A call past its deadline is abandoned, not stopped: it keeps its thread until
    it returns by itself.
    """
    result: list[T] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            result.append(call())
        except BaseException as error:  # noqa: BLE001 raised again in the caller's thread
            failure.append(error)
        finally:
            done.set()

    threading.Thread(target=target, name="raylens-gcs-call", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:g} s")
    if failure:
        raise failure[0]
    return result[0]


class GuardedCluster:
    """A cluster view whose GCS calls are bounded in time and refused while the GCS is down.

    ``probe()`` says whether the GCS accepts connections (a bounded TCP connect);
    :meth:`check` runs it once per cycle. ``run(call, timeout)`` runs one call under
    a deadline (default :func:`run_bounded`; tests pass one that runs in place).
    ``clock`` is monotonic seconds, ``wall`` Unix seconds (shown to the user).
    """

    def __init__(
        self,
        inner: KeyValueClusterView,
        address: str,
        *,
        probe: Callable[[], bool],
        call_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        run: BoundedRunner = run_bounded,
    ) -> None:
        if not call_timeout > 0:
            raise ValueError(f"call_timeout must be positive seconds, got {call_timeout!r}")
        self.inner = inner
        self.address = address
        self.call_timeout = float(call_timeout)
        self._probe = probe
        self.clock = clock
        self._wall = wall
        self._run = run
        self._lock = threading.Lock()
        self._down = False
        self._answered_at = clock()
        self._answered_wall = wall()

    # The state ---------------------------------------------------------------------

    def _answered(self) -> None:
        with self._lock:
            self._down = False
            self._answered_at = self.clock()
            self._answered_wall = self._wall()

    def _failed(self) -> None:
        with self._lock:
            self._down = True

    def check(self) -> bool:
        """Probe the GCS; True when it accepts connections. A failure marks it unreachable.

        A successful probe only lets GCS calls be made again: the cluster counts as
        answering once one of them returns.
        """
        if self._probe():
            with self._lock:
                self._down = False
            return True
        self._failed()
        return False

    @property
    def unreachable(self) -> bool:
        """True since a probe or a call failed, until a probe succeeds."""
        return self._down

    def silent_for(self) -> float | None:
        """Seconds since the cluster last answered, while unreachable; None otherwise."""
        with self._lock:
            if not self._down:
                return None
            return max(0.0, self.clock() - self._answered_at)

    def give_up_at(self, give_up: float) -> float | None:
        """The ``clock`` reading at which a watch waiting ``give_up`` seconds gives up."""
        with self._lock:
            return self._answered_at + give_up if self._down else None

    def describe(self, give_up: float) -> str | None:
        """The line under the table while unreachable, else None."""
        silent = self.silent_for()
        if silent is None:
            return None
        since = datetime.fromtimestamp(self._answered_wall).strftime("%H:%M:%S")
        left = max(0.0, give_up - silent)
        return printable(
            f"cluster unreachable: no answer from its GCS at {self.address} since {since} "
            f"({silent:.0f} s); giving up in {left:.0f} s"
        )

    def give_up_message(self, give_up: float) -> str:
        """The one line ``raylens watch`` exits with."""
        since = datetime.fromtimestamp(self._answered_wall).strftime("%H:%M:%S")
        return printable(
            f"lost the Ray cluster at {self.address}: its GCS has not answered since "
            f"{since}; gave up after {give_up:g} s (--give-up)"
        )

    # Calls ---------------------------------------------------------------------------

    def _call(self, call: Callable[[], T]) -> T:
        if self._down:
            raise ClusterUnreachable(f"the GCS at {self.address} is not answering")
        try:
            value = self._run(call, self.call_timeout)
        except TimeoutError:
            self._failed()
            raise ClusterUnreachable(
                f"the GCS at {self.address} did not answer within {self.call_timeout:g} s"
            ) from None
        self._answered()
        return value

    def is_initialized(self) -> bool:
        return self.inner.is_initialized()

    def nodes(self) -> list[dict[str, object]]:
        return self._call(self.inner.nodes)

    def placement_group_table(self, placement_group: object) -> dict[str, object]:
        return self._call(lambda: self.inner.placement_group_table(placement_group))

    def kv_put(self, key: str, value: bytes) -> None:
        self._call(lambda: self.inner.kv_put(key, value))

    def kv_get(self, key: str) -> bytes | None:
        return self._call(lambda: self.inner.kv_get(key))

    def kv_delete(self, key: str) -> None:
        self._call(lambda: self.inner.kv_delete(key))

    def kv_keys(self, prefix: str) -> list[str]:
        return self._call(lambda: self.inner.kv_keys(prefix))

    def job_id(self) -> str | None:
        return self._call(self.inner.job_id)

    def live_job_ids(self) -> set[str]:
        return self._call(self.inner.live_job_ids)

    def __repr__(self) -> str:
        return f"GuardedCluster({self.inner!r}, {self.address!r})"
