from __future__ import annotations

import logging

import pytest

from raylens.lens import reset_warn_once, warn_once
from raylens.lens.warnings import call_or_warn_once


def test_first_warning_is_loud_with_traceback_then_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="raylens")
    for _ in range(3):
        try:
            raise ConnectionError("node down")
        except ConnectionError:
            warn_once("scrape.n1", "node n1 cannot be scraped")
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert caplog.records[0].exc_info is not None
    assert "node down" in caplog.text


def test_no_traceback_outside_an_except_block(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="raylens")
    assert warn_once("k", "plain") is True
    assert not caplog.records[0].exc_info


def test_keys_are_independent_and_reset_makes_them_loud_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="raylens")
    assert warn_once("a", "a") is True
    assert warn_once("b", "b") is True
    assert warn_once("a", "a") is False
    reset_warn_once("a")
    assert warn_once("a", "a") is True
    assert warn_once("b", "b") is False
    reset_warn_once()
    assert warn_once("b", "b") is True


def test_custom_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    warn_once("c", "to my logger", logger=logging.getLogger("mine"))
    assert caplog.records[0].name == "mine"


def test_remembered_keys_are_bounded_oldest_forgotten_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from raylens.lens.warnings import MAX_REMEMBERED_WARNINGS, remembered_warning_count

    caplog.set_level(logging.ERROR, logger="raylens")  # the return value tells what was loud
    warn_once("node.departed.0", "first node")
    for index in range(1, MAX_REMEMBERED_WARNINGS + 5_000):
        warn_once(f"node.departed.{index}", "a node that came and went")
    assert remembered_warning_count() == MAX_REMEMBERED_WARNINGS

    recent = f"node.departed.{MAX_REMEMBERED_WARNINGS + 4_999}"
    assert warn_once(recent, "still remembered") is False
    assert warn_once("node.departed.0", "forgotten long ago, so loud again") is True


def test_a_repeated_key_stays_remembered_while_others_churn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from raylens.lens.warnings import MAX_REMEMBERED_WARNINGS

    caplog.set_level(logging.ERROR, logger="raylens")
    warn_once("steady", "recurring problem")
    for index in range(MAX_REMEMBERED_WARNINGS * 2):
        warn_once(f"churn.{index}", "one-off")
        if index % 1000 == 0:
            assert warn_once("steady", "recurring problem") is False
    assert warn_once("steady", "recurring problem") is False


def test_call_or_warn_once_returns_the_value_or_warns_once_and_carries_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class HookBroke(Exception):
        """An error of a kind nobody named: a caller's hook may raise anything."""

    caplog.set_level(logging.DEBUG, logger="raylens")
    assert call_or_warn_once(lambda: 7, "hook", "the hook failed") == (True, 7)

    def broken() -> int:
        raise HookBroke("boom")

    outcomes = [call_or_warn_once(broken, "hook", "the hook failed") for _ in range(3)]
    assert outcomes == [(False, None)] * 3
    assert [record.levelno for record in caplog.records] == [
        logging.WARNING,
        logging.DEBUG,
        logging.DEBUG,
    ]
    assert caplog.records[0].exc_info is not None and "boom" in caplog.text


def test_call_or_warn_once_lets_an_interrupt_through() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call_or_warn_once(interrupted, "interrupt", "never logged")
