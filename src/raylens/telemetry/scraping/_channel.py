"""Messages between the driver and its scrape helper, over one stream socket.

Each message is a pickled value behind an 8-byte big-endian length. The two
sides use the socket differently, and that difference is what keeps them from
ever waiting on each other:

- The driver's side (:class:`DriverChannel`) never blocks. Outgoing bytes wait in
  a buffer; :meth:`DriverChannel.exchange` writes them while it reads whatever
  the helper sends, until the reply it wants arrives, its deadline passes or it
  is aborted. A message the helper has not taken by then stays buffered, whole,
  for the next call, so the stream is never cut in the middle of a message.
- The helper's side (:func:`read_message`, :func:`write_message`) blocks. It may,
  because the driver reads everything the helper sends each time it writes.

Only the driver and the helper it started write to this socket, so the helper's
pickled replies are trusted as much as the driver's own memory. Lengths are
still checked against :data:`MAX_MESSAGE_BYTES`, so a broken peer is reported
as broken instead of costing unbounded memory.
"""

from __future__ import annotations

import os
import pickle
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ChannelBroken",
    "DriverChannel",
    "encode",
    "read_message",
    "write_message",
]

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_HEADER = struct.Struct("!Q")
_RECV_BYTES = 1024 * 1024
#: Longest single wait, so an abort is noticed within this many seconds. Every slice wakes
#: the driver's waiting thread, which costs it CPU all the while a batch waits on hung
#: nodes (about 0.1 ms a wake on a loaded VM), so slices are no shorter than the abort
#: needs: well within the 0.5 s a closing engine waits for a batch to let go.
_SLICE_S = 0.2


class ChannelBroken(Exception):
    """The peer closed the socket, or sent something that is not a message."""


def encode(message: object) -> bytes:
    """``message`` framed for the socket."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ValueError(
            f"a {len(payload)}-byte message exceeds the {MAX_MESSAGE_BYTES}-byte channel limit"
        )
    return _HEADER.pack(len(payload)) + payload


def _length(header: bytes | bytearray | memoryview) -> int:
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise ChannelBroken(f"announced a {length}-byte message, over the channel limit")
    return int(length)


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = sock.recv(min(_RECV_BYTES, count - len(chunks)))
        if not chunk:
            raise ChannelBroken("the peer closed the channel")
        chunks += chunk
    return bytes(chunks)


def read_message(sock: socket.socket) -> Any:
    """Block until one whole message has arrived on ``sock``; the helper's side."""
    length = _length(_recv_exactly(sock, _HEADER.size))
    return pickle.loads(_recv_exactly(sock, length))


def write_message(sock: socket.socket, message: object) -> None:
    """Block until ``message`` is written to ``sock``; the helper's side."""
    sock.sendall(encode(message))


class DriverChannel:
    """The driver's end: buffered, non-blocking, bounded by a deadline on every call.

    Not thread-safe on its own; the engine that owns it serialises its calls.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self._outgoing = bytearray()
        self._incoming = bytearray()
        self._closed = False

    @property
    def sending(self) -> bool:
        """True while an earlier message has not been taken whole by the peer."""
        return bool(self._outgoing)

    def queue(self, message: object) -> None:
        """Add ``message`` to what is written on the next :meth:`exchange`."""
        self._outgoing += encode(message)

    def exchange(
        self,
        wanted: Callable[[Any], bool],
        deadline: float,
        abort: threading.Event | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> Any | None:
        """Write what is queued and read until a message ``wanted`` accepts arrives.

        Messages that ``wanted`` refuses are dropped as they are read (late
        answers to batches the driver gave up on). Returns the accepted message,
        or None when the monotonic ``deadline`` passed or ``abort`` was set
        first; what is still queued then stays queued. Raises
        :class:`ChannelBroken` when the peer has gone, or when ``alive`` (asked
        every slice) says so: another process holding a copy of the peer's end
        would otherwise keep the end-of-file from arriving.
        """
        accepted: list[Any] = []

        def arrived() -> bool:
            found = self._take(wanted)
            if found is not None:
                accepted.append(found[0])
            return found is not None

        self._pump(arrived, deadline, abort, alive)
        return accepted[0] if accepted else None

    def flush(
        self,
        deadline: float,
        abort: threading.Event | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> bool:
        """Write what is queued, reading meanwhile, until done or ``deadline``; True when done.

        Messages read meanwhile are dropped as they complete: they answer batches
        that were given up on, so nothing read here is wanted, and a peer that only
        writes cannot grow what is held.
        """

        def sent() -> bool:
            self._take(lambda _message: False)
            return not self._outgoing

        self._pump(sent, deadline, abort, alive)
        return not self._outgoing

    def _pump(
        self,
        done: Callable[[], bool],
        deadline: float,
        abort: threading.Event | None,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or (abort is not None and abort.is_set()):
                return
            if alive is not None and not alive():
                raise ChannelBroken("the peer process has exited")
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._outgoing else 0)
            self._selector.modify(self._sock, events)
            for _, ready in self._selector.select(min(left, _SLICE_S)):
                if ready & selectors.EVENT_READ:
                    self._receive()
                if ready & selectors.EVENT_WRITE:
                    self._send()

    def _send(self) -> None:
        try:
            sent = self._sock.send(self._outgoing)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise ChannelBroken(f"writing to the peer failed: {exc}") from exc
        del self._outgoing[:sent]

    def _receive(self) -> None:
        try:
            chunk = self._sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise ChannelBroken(f"reading from the peer failed: {exc}") from exc
        if not chunk:
            raise ChannelBroken("the peer closed the channel")
        self._incoming += chunk

    def _take(self, wanted: Callable[[Any], bool]) -> tuple[Any] | None:
        """The first complete message ``wanted`` accepts, dropping refused ones before it."""
        while len(self._incoming) >= _HEADER.size:
            length = _length(memoryview(self._incoming)[: _HEADER.size])
            end = _HEADER.size + length
            if len(self._incoming) < end:
                return None
            try:
                message = pickle.loads(memoryview(self._incoming)[_HEADER.size : end])
            except Exception as exc:  # garbled pickles raise nearly anything (SystemError too)
                raise ChannelBroken(f"the peer sent an unreadable message: {exc}") from exc
            del self._incoming[:end]
            if wanted(message):
                return (message,)
        return None

    def abandon(self) -> None:
        """Let go of this end without a word to the peer: a forked child's copy.

        Only this process's descriptors are closed; the socket stays open, and its
        state unchanged, in every other process that holds it.
        """
        if self._closed:
            return
        self._closed = True
        self._selector.close()
        os.close(self._sock.detach())

    def close(self) -> None:
        """Close this end; the peer then reads end-of-file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._selector.close()
        finally:
            self._sock.close()
