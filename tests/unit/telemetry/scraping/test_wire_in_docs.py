"""The helper's messages as docs/architecture.md and the wire module draw them are the ones sent.

Both ends build their messages with the builders in ``telemetry/scraping/_wire.py``; the
drawings in the page and in that module's docstring are compared with ``MESSAGE_FIELDS`` and
``ROW_FIELDS``, and the builders with the same field lists, so a message that gains an item
fails here until both say so.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from raylens.telemetry.scraping import (
    READY_MESSAGE,
    HeldFigures,
    Outcome,
    decode_outcomes,
    encode_outcomes,
    is_result_of,
    scrape_message,
    trust_message,
)
from raylens.telemetry.scraping._wire import MESSAGE_FIELDS, ROW_FIELDS, result_message

# A drawn message: a parenthesised tuple whose first item is one of the kinds, quoted.
_DRAWN = re.compile(r'\("(scrape|trust|ready|result)"[^()\n]*\)')


def _architecture() -> str:
    for parent in Path(__file__).resolve().parents:
        page = parent / "docs" / "architecture.md"
        if page.is_file():
            return page.read_text(encoding="utf-8")
    raise AssertionError(f"no docs/architecture.md above {__file__}")


def _drawing(fields: tuple[str, ...]) -> str:
    kind, *rest = fields
    return f'("{kind}",)' if not rest else f'("{kind}", {", ".join(rest)})'


def test_every_message_the_builders_make_has_the_documented_items() -> None:
    jobs = [("node-a", "http://127.0.0.1:1/metrics", False)]
    built = {
        "scrape": scrape_message(7, jobs, 12.5, {"node-a": 3.0}),
        "trust": trust_message({"actor-1": "worker-1"}),
        "ready": READY_MESSAGE,
        "result": result_message(7, []),
    }

    assert set(built) == set(MESSAGE_FIELDS)
    for kind, message in built.items():
        assert message[0] == kind
        assert len(message) == len(MESSAGE_FIELDS[kind]), kind
    assert is_result_of(built["result"], 7)
    assert not is_result_of(built["result"], 8)
    assert not is_result_of(built["scrape"], 7)


def test_a_row_has_the_documented_items_and_comes_back_as_it_went() -> None:
    jobs = [("node-a", "http://127.0.0.1:1/metrics", False)]
    outcome = Outcome({"ray_node_mem_used": 5.0}, None, elapsed=0.25, duration=0.2)

    rows = encode_outcomes(jobs, {"node-a": outcome}, ())
    decoded = decode_outcomes(rows, ["node-a"], 0.0, HeldFigures())

    # A row is the node's place in the batch, then its outcome's fields in their order.
    assert ("index", *Outcome._fields) == ROW_FIELDS
    assert [len(row) for row in rows] == [len(ROW_FIELDS)]
    assert decoded["node-a"].values == {"ray_node_mem_used": 5.0}
    assert decoded["node-a"].elapsed == pytest.approx(0.25)


@pytest.mark.parametrize("where", ["docs/architecture.md", "the wire module's docstring"])
def test_each_message_and_the_row_are_drawn_with_the_codes_items(where: str) -> None:
    wire_module = sys.modules[scrape_message.__module__]
    page = _architecture() if where.startswith("docs") else wire_module.__doc__ or ""
    expected = {fields[0]: _drawing(fields) for fields in MESSAGE_FIELDS.values()}

    drawn = _DRAWN.findall(page)
    for match in _DRAWN.finditer(page):
        kind = match.group(1)
        assert match.group(0) == expected[kind], f"the page draws {match.group(0)}"
    assert set(drawn) == set(MESSAGE_FIELDS)
    assert f"({', '.join(ROW_FIELDS)})" in page


def test_the_comparison_sees_a_message_drawn_short() -> None:
    stale = 'the driver sends ("scrape", batch, jobs, deadline) and waits'

    found = _DRAWN.search(stale)

    assert found is not None
    assert found.group(0) != _drawing(MESSAGE_FIELDS["scrape"])
