"""Who is called with which data, and which results come back: sharded dispatch without Ray."""

from __future__ import annotations

import pytest

from raylens.distributed import worker_groups as wg
from raylens.distributed import worker_planning as wp
from raylens.distributed.named_sharding import NamedSharding

# dp x tp = 2 x 2: worker = dp * 2 + tp
DP_TP = NamedSharding([[0, 1], [2, 3]], ["dp", "tp"])
# pp x dp x tp = 2 x 2 x 2
PP_DP_TP = NamedSharding([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ["pp", "dp", "tp"])


def calls_of(*args, **kwargs):  # type: ignore[no-untyped-def]
    calls, returned = wp._plan_sharded_calls(*args, **kwargs)
    return [(call.worker_idx, call.data_coords) for call in calls], returned


def test_sharded_on_dp_replicated_on_tp() -> None:
    calls, returned = calls_of(DP_TP, ["dp"], ["tp"], None, False)
    assert calls == [(0, (0,)), (1, (0,)), (2, (1,)), (3, (1,))]
    assert returned == [0, 1, 2, 3]


def test_output_replicated_on_tp_returns_tp_rank_0_only() -> None:
    calls, returned = calls_of(DP_TP, ["dp"], ["tp"], ["tp"], False)
    assert [worker for worker, _ in calls] == [0, 1, 2, 3]
    assert returned == [0, 2]


def test_free_axis_calls_only_index_0() -> None:
    calls, returned = calls_of(DP_TP, ["dp"], None, None, False)
    assert calls == [(0, (0,)), (2, (1,))]
    assert returned == [0, 2]


def test_free_axis_dummy_calls() -> None:
    calls, returned = calls_of(DP_TP, ["dp"], None, None, True)
    assert calls == [(0, (0,)), (1, None), (2, (1,)), (3, None)]
    assert returned == [0, 2]


def test_everything_free_calls_worker_0_only() -> None:
    calls, returned = calls_of(DP_TP, None, None, None, False)
    assert calls == [(0, ())]
    assert returned == [0]


def test_sharded_on_two_axes_in_the_given_order() -> None:
    calls, _ = calls_of(DP_TP, ["tp", "dp"], None, None, False)
    assert calls == [(0, (0, 0)), (1, (1, 0)), (2, (0, 1)), (3, (1, 1))]


def test_three_axes_pipeline_free() -> None:
    calls, returned = calls_of(PP_DP_TP, ["dp"], ["tp"], ["tp"], False)
    assert calls == [(0, (0,)), (1, (0,)), (2, (1,)), (3, (1,))]
    assert returned == [0, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_sharded_axes": ["pp"]}, r"in_sharded_axes names \['pp'\].*\['dp', 'tp'\]"),
        ({"replicate_on_axes": ["x"]}, r"replicate_on_axes names \['x'\]"),
        ({"output_is_replicated": ["x"]}, r"output_is_replicated names \['x'\]"),
        ({"in_sharded_axes": ["dp"], "replicate_on_axes": ["dp"]}, r"\['dp'\] are in both"),
        ({"in_sharded_axes": ["dp", "dp"]}, r"\['dp'\] more than once"),
    ],
)
def test_bad_axes(kwargs: dict[str, list[str]], match: str) -> None:
    arguments = {
        "in_sharded_axes": None,
        "replicate_on_axes": None,
        "output_is_replicated": None,
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        wp._plan_sharded_calls(
            DP_TP,
            arguments["in_sharded_axes"],
            arguments["replicate_on_axes"],
            arguments["output_is_replicated"],
            False,
        )


# ---- slicing --------------------------------------------------------------------------


def test_slice_one_axis() -> None:
    assert wp._slice_sharded(["a", "b"], ["dp"], (1,), DP_TP, "argument 0") == "b"


def test_slice_two_axes_nested_in_given_order() -> None:
    data = [["dp0tp0", "dp1tp0"], ["dp0tp1", "dp1tp1"]]  # outer: tp, inner: dp
    assert wp._slice_sharded(data, ["tp", "dp"], (1, 0), DP_TP, "x") == "dp0tp1"


def test_slice_without_sharded_axes_is_the_whole_value() -> None:
    value = {"whole": True}
    assert wp._slice_sharded(value, [], (), DP_TP, "x") is value


def test_slice_wrong_length_names_argument_and_axis() -> None:
    with pytest.raises(ValueError, match=r"argument 1 has 3 entries along axis 'dp'.*size 2"):
        wp._slice_sharded([1, 2, 3], ["dp"], (0,), DP_TP, "argument 1")


def test_slice_not_a_sequence() -> None:
    with pytest.raises(ValueError, match=r"keyword argument 'batch'.*axis 'dp'.*int"):
        wp._slice_sharded(5, ["dp"], (0,), DP_TP, "keyword argument 'batch'")


# ---- rank-0-only filters and per-worker data -------------------------------------------


def test_rank0_only_without_axes_calls_everyone_even_without_sharding() -> None:
    assert wp._rank0_only_workers(None, 3, None) == [0, 1, 2]
    assert wp._rank0_only_workers(None, 3, []) == [0, 1, 2]


def test_rank0_only_axes() -> None:
    assert wp._rank0_only_workers(DP_TP, 4, ["tp"]) == [0, 2]
    assert wp._rank0_only_workers(DP_TP, 4, ["dp"]) == [0, 1]
    assert wp._rank0_only_workers(DP_TP, 4, ["dp", "tp"]) == [0]


def test_rank0_only_axes_need_sharding_and_known_axes() -> None:
    with pytest.raises(ValueError, match=r"sharding_annotations"):
        wp._rank0_only_workers(None, 4, ["tp"])
    with pytest.raises(ValueError, match=r"\['cp'\]"):
        wp._rank0_only_workers(DP_TP, 4, ["cp"])


def test_multiple_data_lengths() -> None:
    wp._check_multiple_data_lengths([[1, 2, 3]], {"k": "abc"}, 3)
    with pytest.raises(ValueError, match=r"argument 1 has 2 entries.*\(3\)"):
        wp._check_multiple_data_lengths([[1, 2, 3], [1, 2]], {}, 3)
    with pytest.raises(ValueError, match=r"k has 4 entries"):
        wp._check_multiple_data_lengths([], {"k": [1, 2, 3, 4]}, 3)
    with pytest.raises(ValueError, match=r"argument 0 must be a list.*int"):
        wp._check_multiple_data_lengths([7], {}, 3)


def test_common_kwargs_clash() -> None:
    wp._check_no_kwarg_clash({"a": 1}, {"b": [1]})
    with pytest.raises(ValueError, match=r"\['a'\]"):
        wp._check_no_kwarg_clash({"a": 1}, {"a": [1]})


# ---- selecting results ----------------------------------------------------------------

SOLO = {0: 0, 1: 1, 2: 2, 3: 3}
PAIRS = {0: 0, 1: 0, 2: 1, 3: 1}


def test_select_all_called() -> None:
    assert wp._select_results(["a", "b", "c"], [0, 1, 3], None, SOLO) == ["a", "b", "c"]


def test_select_return_from_workers_in_their_order() -> None:
    results = ["w0", "w1", "w2", "w3"]
    assert wp._select_results(results, [0, 1, 2, 3], [2, 0], SOLO) == ["w2", "w0"]


def test_select_skips_workers_that_were_not_called() -> None:
    assert wp._select_results(["w0", "w2"], [0, 2], [0, 1, 2], SOLO) == ["w0", "w2"]


def test_select_keeps_first_of_each_tied_group() -> None:
    results = ["w0", "w1", "w2", "w3"]
    assert wp._select_results(results, [0, 1, 2, 3], None, PAIRS) == ["w0", "w2"]
    assert wp._select_results(results, [0, 1, 2, 3], [1, 0, 3], PAIRS) == ["w1", "w3"]


def test_select_workers_unknown_to_the_mapping_are_kept() -> None:
    assert wp._select_results(["a", "b"], [0, 9], None, {0: 0}) == ["a", "b"]


def test_select_without_called_workers_uses_positions_and_no_dedup() -> None:
    assert wp._select_results(["a", "b", "c"], None, None, PAIRS) == ["a", "b", "c"]
    assert wp._select_results(["a", "b", "c"], None, [2, 0, 7], PAIRS) == ["c", "a"]


def test_select_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match=r"2 futures but 3 called workers"):
        wp._select_results(["a", "b"], [0, 1, 2], None, SOLO)


def test_multi_worker_future_fields() -> None:
    future = wg.MultiWorkerFuture(futures=["r0"])
    assert future.return_from_workers is None
    assert future.called_workers is None
    full = wg.MultiWorkerFuture(
        futures=["r0", "r1"], return_from_workers=[0], called_workers=[0, 2]
    )
    assert full.called_workers == [0, 2]
