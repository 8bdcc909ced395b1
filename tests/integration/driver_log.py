"""Reading a Ray driver's log for tracebacks that are raylens' concern.

Ray forwards every worker's stderr to the driver, prefixed ``(ActorName pid=N)``. A
worker the raylet ends with SIGTERM (an OOM kill, a job ending) may print a traceback
that ends in ``SystemExit`` raised by Ray's own SIGTERM handler, when the signal lands
while Python runs a finalizer. That traceback is how Ray reports a kill it made, not a
fault; every other traceback is one.
"""

from __future__ import annotations

#: The frame Ray's SIGTERM handler raises from.
RAY_SIGTERM_FRAME = "raise_sys_exit_with_custom_error_message"


def _origin(line: str) -> str:
    """The ``(ActorName pid=N)`` prefix Ray puts on a forwarded line, or ``""``."""
    start = line.find("(")
    end = line.find(")", start + 1)
    if start == -1 or end == -1 or "pid=" not in line[start:end]:
        return ""
    return line[start : end + 1]


def unexplained_tracebacks(log: str) -> list[str]:
    """The tracebacks in ``log``, one text each, less those of Ray's SIGTERM kills."""
    lines = log.splitlines()
    found: list[str] = []
    for index, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        origin = _origin(line)
        block = [line]
        for following in lines[index + 1 :]:
            if _origin(following) != origin:
                break
            block.append(following)
            if "Traceback (most recent call last)" in following:
                break
        text = "\n".join(block)
        if RAY_SIGTERM_FRAME in text and "SystemExit" in text:
            continue
        found.append(text)
    return found
