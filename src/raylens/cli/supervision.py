"""How ``raylens profile`` runs its command and stops it: the whole process group, as ``timeout`` does.

The command starts as the leader of a process group of its own. Whatever ends
raylens early (Ctrl-C, SIGTERM, an error in raylens) is passed to that group, so the
command's children and grandchildren (``sh -c 'a & b & wait'``) stop with it instead of
running on unwatched. A command that ends by itself is left alone, its children too.

A terminal's Ctrl-C reaches only raylens' own group; raylens forwards it once. As
under ``timeout``, the command's group is not the terminal's foreground group, so a
command that reads from the terminal is stopped by it (SIGTTIN) until resumed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import IO, Any

# How long the command has to end by itself after Ctrl-C, then after SIGTERM.
INTERRUPT_GRACE_S = 10.0
TERMINATE_GRACE_S = 5.0
# How long what is left of the group after the command ended has, after SIGTERM.
_LEFTOVER_GRACE_S = 2.0
_POLL_S = 0.02


class CommandGroup:
    """A started command and, when it leads one, its process group.

    It answers ``poll``, ``wait``, ``pid`` and ``returncode`` as its
    :class:`subprocess.Popen` does, while ``send_signal``, ``terminate`` and ``kill``
    reach every process of the group (and the command itself if it left the group).
    """

    def __init__(self, process: subprocess.Popen, *, own_group: bool) -> None:
        self.process = process
        self.own_group = own_group

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout=timeout)

    def send_signal(self, sig: int) -> None:
        if self.own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
            if not self._left_the_group():
                return
        if self.process.poll() is None:
            self.process.send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _left_the_group(self) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            return os.getpgid(self.pid) != self.pid
        except ProcessLookupError:
            return False

    def group_alive(self) -> bool:
        """True while any process of the command's group is left (its leader may have ended)."""
        if not self.own_group:
            return False
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def end_leftovers(self, grace_s: float = _LEFTOVER_GRACE_S) -> None:
        """After the command ended: SIGTERM what is left of its group, SIGKILL it past ``grace_s``."""
        if not self.group_alive():
            return
        self.terminate()
        deadline = time.monotonic() + grace_s
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if self.group_alive():
            self.kill()


def start_command(argv: Sequence[str], *, stdout: int | IO[Any] | None = None) -> CommandGroup:
    """Start ``argv`` as the leader of a new process group; OSError when it cannot be run.

    A group, not a session: the command keeps the terminal, and may still move to a
    group of its own as some launchers do.
    """
    if sys.version_info >= (3, 11):
        process = subprocess.Popen(list(argv), stdout=stdout, process_group=0)
    else:  # pragma: no cover - Python 3.10 has no process_group
        process = subprocess.Popen(list(argv), stdout=stdout, preexec_fn=os.setpgrp)
    return CommandGroup(process, own_group=True)


def terminal_interrupted(child: CommandGroup | subprocess.Popen) -> bool:
    """True when a Ctrl-C typed in our terminal has reached ``child`` as well.

    The terminal interrupts its whole foreground process group: that covers the
    command only when it shares this process's group, which a command started by
    :func:`start_command` never does.
    """
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        group = os.getpgrp()
        return os.tcgetpgrp(tty) == group and os.getpgid(child.pid) == group
    except OSError:
        return False
    finally:
        os.close(tty)


def stop_child(
    child: CommandGroup | subprocess.Popen,
    *,
    forward: bool | None = None,
    interrupt_grace_s: float = INTERRUPT_GRACE_S,
    terminate_grace_s: float = TERMINATE_GRACE_S,
) -> int:
    """Stop the profiled command after Ctrl-C; returns its ``returncode``.

    The command gets the interrupt (forwarded unless ``forward`` is False; by
    default only when the terminal did not already deliver it) and
    ``interrupt_grace_s`` to wind down as it would without raylens, then SIGTERM
    and ``terminate_grace_s``, then SIGKILL. Another Ctrl-C kills it at once.
    Given a :class:`CommandGroup`, every signal goes to the whole group.
    """
    code = child.poll()
    if code is not None:
        return code
    try:
        if forward is None:
            forward = not terminal_interrupted(child)
        if forward:
            child.send_signal(signal.SIGINT)
        print(
            f"raylens: waiting up to {interrupt_grace_s:g} s for the command to end "
            "(Ctrl-C again to kill it)",
            file=sys.stderr,
        )
        try:
            return child.wait(timeout=interrupt_grace_s)
        except subprocess.TimeoutExpired:
            child.terminate()
        try:
            return child.wait(timeout=terminate_grace_s)
        except subprocess.TimeoutExpired:
            pass
    except KeyboardInterrupt:
        pass
    child.kill()
    return child.wait()


def terminate_child(child: CommandGroup, grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM the command's group, then SIGKILL it if the command outlives ``grace_s``."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    child.end_leftovers()


def kill_child(child: CommandGroup) -> None:
    """SIGKILL the command's whole group at once and reap the command."""
    child.kill()
    child.wait()


class Terminated(BaseException):
    """SIGTERM arrived: raylens stops what it started and exits with 143.

    Like KeyboardInterrupt it is not an Exception, so code that handles errors with
    ``except Exception`` lets it through.
    """


def raise_on_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into :class:`Terminated`, which unwinds like Ctrl-C; returns the undo.

    Without it, ``timeout 60 raylens profile -- cmd`` would end raylens and leave
    ``cmd`` running, unwatched, and a simulated cluster or a monitor would stop
    without their clean-up. Signal handlers belong to the main thread; elsewhere
    this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        # None: the handler in place was installed outside Python and cannot be put back.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    return restore


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 64`` for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
