"""Reading a Ray driver's log for tracebacks that are raylens' concern.

Ray forwards every worker's stderr to the driver, prefixed ``(ActorName pid=N)``. A
worker the raylet ends (an OOM kill, a job ending) may print a traceback of its own
ending: Ray's SIGTERM handler raises ``SystemExit`` wherever the process was, and when
that is inside Ray's ``ActorHandle.__del__`` finalizer, Python reports it as "Exception
ignored in" that finalizer, a report the kill may cut short at any line. Those are how
Ray reports a kill it made, not a fault; every other traceback is one.
"""

from __future__ import annotations

#: The frame Ray's SIGTERM handler raises from.
RAY_SIGTERM_FRAME = "raise_sys_exit_with_custom_error_message"
#: How Python introduces an exception raised in Ray's actor-handle finalizer.
RAY_FINALIZER_REPORT = "Exception ignored in: <function ActorHandle.__del__"
_TRACEBACK = "Traceback (most recent call last)"


def _split(line: str) -> tuple[str, str]:
    """``(origin, text)``: Ray's ``(ActorName pid=N)`` prefix (``""`` for the driver's own
    lines) and what follows it, colour codes around the prefix left out."""
    start = line.find("(")
    end = line.find(")", start + 1)
    if start == -1 or end == -1 or "pid=" not in line[start:end]:
        return "", line
    text = line[end + 1 :]
    if text.startswith("\x1b[0m"):
        text = text[len("\x1b[0m") :]
    return line[start : end + 1], text


def unexplained_tracebacks(log: str) -> list[str]:
    """The tracebacks in ``log``, one text each, less those of Ray's own kills.

    Lines are read per process (Ray interleaves the processes' lines), and a traceback
    ends at its exception's line or where that process's lines end.
    """
    streams: dict[str, list[str]] = {}
    for line in log.splitlines():
        origin, text = _split(line)
        streams.setdefault(origin, []).append(text)
    found: list[str] = []
    for origin, texts in streams.items():
        for index, text in enumerate(texts):
            if _TRACEBACK not in text:
                continue
            block = [text]
            for following in texts[index + 1 :]:
                if _TRACEBACK in following:
                    break
                block.append(following)
                if following and not following[0].isspace():
                    break  # the exception's own line ends the traceback
            body = "\n".join(block)
            after_finalizer = index > 0 and RAY_FINALIZER_REPORT in texts[index - 1]
            if after_finalizer or (RAY_SIGTERM_FRAME in body and "SystemExit" in body):
                continue
            found.append(f"{origin} {body}".strip())
    return found
