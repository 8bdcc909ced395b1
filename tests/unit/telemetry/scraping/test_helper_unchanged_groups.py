"""A node's group figures cross from the helper to the driver only when its sampler published anew."""

from __future__ import annotations

from raylens.telemetry.host_memory._helper_engine import GroupFiguresMemo
from raylens.telemetry.raylet_payload import GroupFigure, NodeGroupFigures
from raylens.telemetry.scraping import Outcome, encode_outcomes
from raylens.telemetry.scraping._helper_program import leave_out_known_groups


def _figures(stamp: float, rss: float = 1e9) -> NodeGroupFigures:
    return NodeGroupFigures(stamp, (GroupFigure("policy", rss, None, 2.0, None),))


def _received(
    memo: GroupFiguresMemo, results: dict[str, Outcome], unchanged: set[str], offset: float
) -> dict[str, Outcome]:
    """What the driver makes of the helper's answer to a batch of ``results``' keys."""
    keys = list(results)
    jobs = [(key, f"http://127.0.0.1:1/{key}", False) for key in keys]
    decoded = memo.decode(encode_outcomes(jobs, results, unchanged), keys, offset)
    return {str(key): outcome for key, outcome in decoded.items()}


def test_the_helper_leaves_out_figures_the_driver_already_holds() -> None:
    results = {
        "same": Outcome({"used": 1.0}, None, groups=_figures(10.0)),
        "newer": Outcome({"used": 1.0}, None, groups=_figures(20.0)),
        "unknown": Outcome({"used": 1.0}, None, groups=_figures(30.0)),
        "none": Outcome({"used": 1.0}, None),
    }
    known = {"same": 10.0, "newer": 15.0, "none": 5.0}

    sent, unchanged = leave_out_known_groups(results, known)

    assert unchanged == {"same"}
    assert sent["same"].groups is None
    assert sent["newer"].groups == _figures(20.0)
    assert sent["unknown"].groups == _figures(30.0)
    assert sent["none"].groups is None
    assert sent["same"].values == {"used": 1.0}


def test_the_driver_restores_what_it_holds_and_learns_what_came() -> None:
    memo = GroupFiguresMemo()
    first = _received(memo, {"a": Outcome({}, None, groups=_figures(10.0))}, set(), offset=0.5)
    assert first["a"].groups == _figures(10.0)
    assert first["a"].elapsed == 0.5
    assert memo.known(["a", "b"]) == {"a": 10.0}

    again = _received(memo, {"a": Outcome({}, None, elapsed=1.0)}, {"a"}, offset=0.25)

    assert again["a"].groups == _figures(10.0)
    assert again["a"].elapsed == 1.25


def test_a_node_whose_payload_lost_its_figures_is_forgotten() -> None:
    memo = GroupFiguresMemo()
    _received(memo, {"a": Outcome({}, None, groups=_figures(10.0))}, set(), offset=0.0)

    after = _received(memo, {"a": Outcome({}, None)}, set(), offset=0.0)

    assert after["a"].groups is None
    assert memo.known(["a"]) == {}


def test_an_unanswered_node_keeps_its_figures_and_a_departed_one_is_dropped() -> None:
    memo = GroupFiguresMemo()
    _received(
        memo,
        {
            "a": Outcome({}, None, groups=_figures(1.0)),
            "b": Outcome({}, None, groups=_figures(2.0)),
        },
        set(),
        offset=0.0,
    )
    _received(memo, {}, set(), offset=0.0)  # neither answered this time

    assert memo.known(["a"]) == {"a": 1.0}  # b is no longer a job: forgotten
    assert memo.known(["a", "b"]) == {"a": 1.0}


def test_a_claim_of_unchanged_figures_the_driver_does_not_hold_yields_none() -> None:
    memo = GroupFiguresMemo()

    after = _received(memo, {"a": Outcome({}, None)}, {"a"}, offset=0.0)

    assert after["a"].groups is None
