"""A batch's outcomes cross from the helper to the driver as flat rows and come back whole."""

from __future__ import annotations

import gc
import math
import pickle
import socket
from collections.abc import Hashable

import pytest

from raylens.telemetry.host_memory._helper_engine import GroupFiguresMemo
from raylens.telemetry.raylet_payload import GroupFigure, NodeGroupFigures, NodeOomCounts
from raylens.telemetry.scraping import (
    READY_MESSAGE,
    WIRE_VERSION,
    ChannelBroken,
    HeldFigures,
    MalformedRows,
    Outcome,
    decode_outcomes,
    encode_outcomes,
    scrape_message,
    trust_message,
)
from raylens.telemetry.scraping._channel import read_message, write_message
from raylens.telemetry.scraping._helper_program import leave_out_known_groups
from raylens.telemetry.scraping._wire import GROUPS_UNCHANGED, MESSAGE_FIELDS, result_message


def _figures(stamp: float, rss: float = 1e9) -> NodeGroupFigures:
    return NodeGroupFigures(
        stamp,
        (
            GroupFigure("policy", rss, math.nan, 2.0, None),
            GroupFigure("rollout\ufffd", 1e308, None, None, 12.5),
        ),
    )


def _jobs(*keys: Hashable) -> list[tuple[Hashable, str, bool]]:
    return [(key, f"http://127.0.0.1:1/{index}", False) for index, key in enumerate(keys)]


def _across(rows: object) -> object:
    """What the driver unpickles from what the helper pickled."""
    return pickle.loads(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))


def _same(a: object, b: object) -> bool:
    """Equal, NaN included (a NaN equals itself only as the very same object)."""
    return pickle.dumps(a) == pickle.dumps(b)


HOSTILE = {
    ("n1", "h1"): Outcome(
        {"host_memory_used": math.nan, "host_memory_total": 1.7e308, "x": -0.0},
        None,
        elapsed=0.25,
        duration=0.1,
        groups=_figures(100.0),
        oom=NodeOomCounts(None, 3.0),
    ),
    ("n2", "h2"): Outcome(
        None, "HTTP 500 \u00e9rror", wedged=True, elapsed=5.0, error_type="http_status"
    ),
    ("n3", "h3"): Outcome({"host_memory_used": math.inf}, None, asked=True, elapsed=1e-9),
    ("n4", "h4"): Outcome(None, "not asked", wedged=True, asked=False, error_type="timeout"),
    ("n5", "h5"): Outcome({"host_memory_used": 1.0}, None, groups=NodeGroupFigures(5.0, ())),
}


def test_every_outcome_comes_back_equal_with_the_offset_added() -> None:
    keys = list(HOSTILE)
    rows = _across(encode_outcomes(_jobs(*keys), HOSTILE, set()))

    decoded = decode_outcomes(rows, keys, 2.0, HeldFigures())  # type: ignore[arg-type]

    assert set(decoded) == set(HOSTILE)
    for key, sent in HOSTILE.items():
        assert _same(decoded[key], sent._replace(elapsed=sent.elapsed + 2.0)), key
        assert type(decoded[key]) is Outcome
    figures = decoded[("n1", "h1")].groups
    assert type(figures) is NodeGroupFigures and type(figures.groups[0]) is GroupFigure
    assert type(decoded[("n1", "h1")].oom) is NodeOomCounts


def test_rows_are_plain_values_and_decoded_values_leave_the_collector_nothing_to_walk() -> None:
    keys = list(HOSTILE)
    rows = encode_outcomes(_jobs(*keys), HOSTILE, set())

    assert all(type(row) is tuple for row in rows)
    assert all(type(row[8]) in (tuple, type(None)) for row in rows)
    decoded = decode_outcomes(_across(rows), keys, 0.0, HeldFigures())  # type: ignore[arg-type]
    assert not gc.is_tracked(decoded[("n1", "h1")].values)


def test_rows_name_the_node_by_its_place_in_the_batch_and_unknown_keys_are_left_out() -> None:
    results = {"b": Outcome({"used": 1.0}, None), "stray": Outcome({"used": 2.0}, None)}

    rows = encode_outcomes(_jobs("a", "b"), results, set())

    assert [row[0] for row in rows] == [1]
    assert decode_outcomes(rows, ["a", "b"], 0.0, HeldFigures()) == {"b": results["b"]}


def test_figures_the_driver_holds_are_not_sent_and_come_back_from_what_it_holds() -> None:
    sent = {"a": Outcome({"used": 1.0}, None, groups=_figures(10.0))}
    results, unchanged = leave_out_known_groups(dict(sent), {"a": 10.0})
    rows = encode_outcomes(_jobs("a"), results, unchanged)
    assert rows[0][8] is GROUPS_UNCHANGED

    held = _holding(a=_figures(10.0))
    decoded = decode_outcomes(_across(rows), ["a"], 0.0, held)  # type: ignore[arg-type]

    assert decoded["a"].groups is held.figures["a"]


def test_unchanged_figures_the_driver_no_longer_holds_come_back_as_none() -> None:
    rows = [(0, {"used": 1.0}, None, False, True, 0.0, None, 0.1, GROUPS_UNCHANGED, None, None)]

    assert decode_outcomes(rows, ["a"], 0.0, HeldFigures())["a"].groups is None


def test_what_is_held_follows_each_answer_and_an_unanswered_node_keeps_its_figures() -> None:
    held = _holding(gone=_figures(1.0), silent=_figures(2.0))
    results = {
        "gone": Outcome({"used": 1.0}, None),
        "new": Outcome({"used": 1.0}, None, groups=_figures(3.0)),
    }
    keys = ["gone", "silent", "new"]

    rows = _across(encode_outcomes(_jobs(*keys), results, set()))

    decode_outcomes(rows, keys, 0.0, held)  # type: ignore[arg-type]

    assert sorted(held.figures) == ["new", "silent"]
    assert _same(held.figures["silent"], _figures(2.0)) and _same(
        held.figures["new"], _figures(3.0)
    )


def _decode_one(key: str, figures: NodeGroupFigures, held: HeldFigures) -> NodeGroupFigures:
    rows = _across(encode_outcomes(_jobs(key), {key: Outcome({}, None, groups=figures)}, set()))
    decoded = decode_outcomes(rows, [key], 0.0, held)[key].groups  # type: ignore[arg-type]
    assert decoded is not None
    return decoded


def test_a_new_reading_equal_in_every_group_shares_the_figures_held() -> None:
    plain = NodeGroupFigures(1.0, (GroupFigure("policy", 1.0, None, 3.0, None),) * 2)
    held = HeldFigures()
    first = _decode_one("a", plain, held)

    again = _decode_one("a", plain._replace(sampled_at=2.0), held)

    assert again == plain._replace(sampled_at=2.0) and again.rows is first.rows
    assert held.figures["a"] is again


def test_a_changed_reading_is_built_afresh_and_held_from_then_on() -> None:
    held = HeldFigures()
    first = _decode_one("a", _figures(1.0), held)

    changed = _decode_one("a", _figures(2.0, rss=2e9), held)
    assert changed.groups[0].rss_bytes == 2e9 and changed.rows is not first.rows
    # A NaN never equals another NaN: a reading holding one is rebuilt, equal all the same.
    again = _decode_one("a", _figures(3.0, rss=2e9), held)
    assert _same(again.rows, changed.rows)
    assert held.figures["a"] is again


def test_figures_held_are_forgotten_with_their_node() -> None:
    held = HeldFigures()
    _decode_one("a", _figures(1.0), held)
    _decode_one("b", _figures(1.0), held)

    held.keep_only(["b", "c"])

    assert set(held.figures) == {"b"}


def _holding(**figures: NodeGroupFigures) -> HeldFigures:
    held = HeldFigures()
    held.figures.update(figures)
    return held


GOOD = (0, {"used": 1.0}, None, False, True, 0.0, None, 0.1, None, None, None)


@pytest.mark.parametrize(
    "row",
    [
        [*GOOD],
        GOOD[:9],
        (5, *GOOD[1:]),
        (-1, *GOOD[1:]),
        ("0", *GOOD[1:]),
        (*GOOD[:5], "soon", *GOOD[6:]),
        (*GOOD[:8], (1.0, ("policy", 1.0)), None, None),
        (*GOOD[:8], (1.0, "policy"), None, None),
        (*GOOD[:8], [1.0], None, None),
        (*GOOD[:8], (), None, None),
        (*GOOD[:9], (1.0,), None),
        (*GOOD[:9], 7, None),
        (*GOOD[:10], (1, "forged=1e300")),
        (*GOOD[:10], ("1", ())),
        (*GOOD[:10], (1, (3,))),
    ],
)
def test_a_row_not_shaped_as_written_is_refused_whole(row: object) -> None:
    with pytest.raises(MalformedRows):
        decode_outcomes([GOOD, row], ["a"], 0.0, HeldFigures())  # type: ignore[list-item]


def test_the_engines_memo_reports_unreadable_rows_as_a_broken_channel() -> None:
    memo = GroupFiguresMemo()

    with pytest.raises(ChannelBroken, match="unreadable result"):
        memo.decode([(3, *GOOD[1:])], ["a"], 0.0)


def test_the_helper_imports_raylens_from_where_the_driver_did() -> None:
    """Rows decode only with the code that wrote them: never another installed copy."""
    from pathlib import Path

    import raylens
    from raylens.telemetry.host_memory import _helper_engine

    root = Path(_helper_engine._IMPORT_ROOT)
    assert root.is_absolute()
    assert root / "raylens" == Path(raylens.__file__).resolve().parent


def _tracked_inside(root: object) -> int:
    """GC-tracked objects held by ``root`` (types aside): what a full collection walks for it."""
    count, stack = 0, list(gc.get_referents(root))
    while stack:
        held = stack.pop()
        if isinstance(held, type) or not gc.is_tracked(held):
            continue
        count += 1
        stack.extend(gc.get_referents(held))
    return count


def test_a_new_reading_is_one_object_for_the_collector_whatever_its_groups() -> None:
    # The driver holds one reading per node; a full collection comes sooner for every
    # object that outlives a cycle, so the groups' figures must not be objects of their own.
    groups = tuple(GroupFigure(f"group-{n}", 1e9 + n, None, 2.0, None) for n in range(4))
    decoded = _decode_one("a", NodeGroupFigures(1.0, groups), HeldFigures())
    # A collection stops tracking a tuple of plain values when it looks at it, and a tuple
    # of such tuples at the next look.
    gc.collect()
    gc.collect()
    assert _tracked_inside(decoded) == 0
    assert decoded.groups == groups and decoded.sampled_at == 1.0


def test_every_message_crosses_a_real_socket_unchanged() -> None:
    rows = encode_outcomes(_jobs(*HOSTILE), HOSTILE, set())
    messages = [
        scrape_message(7, _jobs("n1", ("n2", "h2")), 12.5, {"n1": 1.7e9}),
        trust_message({"sampler-a": "f" * 56}),
        trust_message(None),
        READY_MESSAGE,
        result_message(7, rows),
    ]
    driver, helper = socket.socketpair()
    with driver, helper:
        for message in messages:
            write_message(helper, message)
            assert _same(read_message(driver), message)
    assert READY_MESSAGE == ("ready", WIRE_VERSION)
    assert set(MESSAGE_FIELDS) == {message[0] for message in messages}
    assert all(len(MESSAGE_FIELDS[m[0]]) == len(m) for m in messages)
