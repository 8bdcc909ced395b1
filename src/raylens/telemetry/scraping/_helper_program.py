"""The scrape helper's own side: the program the helper process runs.

Started by :class:`~raylens.telemetry.host_memory._helper_engine.HelperEngine` as
``python -c`` calling :func:`main` with the socket's descriptor, the driver's pid
and the scrape limits on the command line. It imports only the engine and the channel, never
the driver's script. It ignores SIGINT (a Ctrl-C in the driver's terminal is the
driver's to handle; the helper then ends with it) and exits as soon as its
driver is gone, SIGKILL included, or the channel closes.

Messages in: a scrape request per batch, and a trust message naming the sampler ids whose
series to believe from then on; out: ``ready`` once, then a result per batch, with one row
per node that answered, without the group figures the driver holds already
(:func:`leave_out_known_groups`). :mod:`raylens.telemetry.scraping._wire` defines them all.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Hashable, Mapping

from raylens.telemetry.scraping._channel import ChannelBroken, read_message, write_message
from raylens.telemetry.scraping._engine import AsyncScrapeEngine, Outcome, ScrapeLimits
from raylens.telemetry.scraping._wire import (
    READY_MESSAGE,
    encode_outcomes,
    is_trust_message,
    result_message,
)

__all__ = ["HELPER_SLACK_S", "leave_out_known_groups", "main", "serve"]

_PARENT_POLL_S = 0.2
#: How long past a batch's deadline the helper waits for answers on their way; the
#: driver waits longer, which leaves the rest for the trip back.
HELPER_SLACK_S = 0.05


def _watch_parent(parent_pid: int) -> None:
    """Exit this process as soon as its parent is gone (reparented to someone else)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(_PARENT_POLL_S)  # a watchdog's polling period, not synchronisation


def leave_out_known_groups(
    results: dict[Hashable, Outcome], known: Mapping[Hashable, float]
) -> tuple[dict[Hashable, Outcome], set[Hashable]]:
    """Drop the group figures the driver already holds; return the results and those keys.

    A sampler publishes every few seconds and the driver may scrape more often; a reading
    it has already received would cost it an unpickling and a comparison for nothing.
    """
    unchanged: set[Hashable] = set()
    for key, outcome in results.items():
        groups = outcome.groups
        if groups is not None and known.get(key) == groups.sampled_at:
            results[key] = outcome._replace(groups=None)
            unchanged.add(key)
    return results, unchanged


def serve(sock: socket.socket, limits: ScrapeLimits) -> None:
    """Answer scrape batches on ``sock`` until it closes or a message says otherwise."""
    engine = AsyncScrapeEngine(limits)
    try:
        write_message(sock, READY_MESSAGE)
        while True:
            message = read_message(sock)
            if is_trust_message(message):
                ids = message[1]
                engine.trust_samplers(None if ids is None else dict(ids))
                continue
            if not (isinstance(message, tuple) and message and message[0] == "scrape"):
                return
            _, batch, jobs, deadline, known = message
            seconds = deadline - time.monotonic()
            results: dict[Hashable, Outcome] = (
                engine.scrape(jobs, seconds, HELPER_SLACK_S) if seconds > 0 else {}
            )
            results, unchanged = leave_out_known_groups(results, known)
            write_message(sock, result_message(batch, encode_outcomes(jobs, results, unchanged)))
    except (ChannelBroken, OSError):
        return
    finally:
        engine.close(0.5)


def main(argv: list[str] | None = None) -> None:
    """Run the helper: ``FD PARENT_PID TIMEOUT MAX_BODY_BYTES MAX_CONCURRENCY``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, parent_pid, timeout, max_body, concurrency = (argv or sys.argv[1:])[:5]
    threading.Thread(
        target=_watch_parent, args=(int(parent_pid),), name="raylens-helper-watchdog", daemon=True
    ).start()
    limits = ScrapeLimits(float(timeout), int(max_body), int(concurrency))
    sock = socket.socket(fileno=int(fd))
    sock.setblocking(True)
    try:
        serve(sock, limits)
    finally:
        sock.close()
