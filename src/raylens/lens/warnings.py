"""Log a recurring problem loudly once, then quietly.

Background paths (scrape loops, gauge callbacks, samplers) meet the same failure
every cycle. :func:`warn_once` keeps the first occurrence visible at WARNING, with
the traceback of the exception being handled if there is one, and demotes the
rest to DEBUG so a dead node does not flood the log.

State: the keys already warned about, at most :data:`MAX_REMEMBERED_WARNINGS` of
them. Keys often name a node or a process, and on a long run nodes and processes
come and go, so the key used least recently is forgotten first; a problem that
keeps recurring keeps its key. :func:`reset_warn_once` clears them all.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from raylens import forking

_LOGGER = logging.getLogger("raylens")

MAX_REMEMBERED_WARNINGS = 4096

_T = TypeVar("_T")

_WARNED_KEYS: OrderedDict[str, None] = OrderedDict()
_WARNED_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_WARNED_LOCK")


def warn_once(key: str, message: str, *, logger: logging.Logger | None = None) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen, at DEBUG after.

    Called from inside an ``except`` block, the first log line carries the
    traceback of the exception being handled. Returns True when this call was
    the one that warned, so a caller can attach extra one-time work to it.
    """
    log = logger or _LOGGER
    with _WARNED_LOCK:
        first = key not in _WARNED_KEYS
        _WARNED_KEYS[key] = None
        _WARNED_KEYS.move_to_end(key)
        while len(_WARNED_KEYS) > MAX_REMEMBERED_WARNINGS:
            _WARNED_KEYS.popitem(last=False)
    handling = sys.exc_info()[0] is not None
    if first:
        log.warning(message, exc_info=handling)
    else:
        log.debug(message, exc_info=handling)
    return first


def reset_warn_once(key: str | None = None) -> None:
    """Forget ``key`` (or every key when None), so its next warning is loud again."""
    with _WARNED_LOCK:
        if key is None:
            _WARNED_KEYS.clear()
        else:
            _WARNED_KEYS.pop(key, None)


def remembered_warning_count() -> int:
    """How many keys :func:`warn_once` currently remembers (at most :data:`MAX_REMEMBERED_WARNINGS`)."""
    with _WARNED_LOCK:
        return len(_WARNED_KEYS)


def call_or_warn_once(
    action: Callable[[], _T],
    warning_key: str,
    warning: str,
    *,
    logger: logging.Logger | None = None,
) -> tuple[bool, _T | None]:
    """``(True, action())``, or ``(False, None)`` once ``warning`` is given to :func:`warn_once`.

    Never raises. lens' one guard around code that is not its own: callers' gauge
    callbacks and recorded values, the SDK's internals, meter providers, exporters,
    endpoints and other layers' shutdown hooks.
    """
    try:
        return True, action()
    except Exception:  # noqa: BLE001 others' code: callbacks, SDK, hooks
        warn_once(warning_key, warning, logger=logger)
        return False, None
