"""Undoing raise_on_sigterm leaves a usable SIGTERM handler, whatever was there before."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from raylens.cli.supervision import Terminated, raise_on_sigterm


@pytest.fixture
def sigterm_kept() -> Iterator[None]:
    original = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, original)


@pytest.mark.usefixtures("sigterm_kept")
def test_undo_puts_back_the_handler_that_was_there() -> None:
    def before(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, before)
    undo = raise_on_sigterm()
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler) and handler is not before
    with pytest.raises(Terminated):
        handler(signal.SIGTERM, None)
    assert undo() is None
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.usefixtures("sigterm_kept")
def test_undo_after_a_handler_installed_outside_python_restores_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # signal.signal answers None when the handler in place was not installed from Python
    # (by C code at start-up); it cannot be put back, and None is no handler to install.
    real_signal = signal.signal

    def first_reports_unknown(signum: int, handler: object) -> object:
        real_signal(signum, handler)
        monkeypatch.setattr(signal, "signal", real_signal)
        return None

    monkeypatch.setattr(signal, "signal", first_reports_unknown)
    undo = raise_on_sigterm()
    undo()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
