"""Look-alike series another job publishes cannot crowd the real ones out of a scrape.

Any job can publish series under raylens' names, and lines that merely look like them;
the kept wanted lines are bounded (256 KiB a response), so what is kept must not go to
whoever writes first or most.
"""

from __future__ import annotations

import random

import pytest

from raylens.telemetry.prometheus_text import WantedLines
from raylens.telemetry.raylet_payload import (
    RAY_WORKER_ID_LABEL,
    TOTAL_KEY,
    USED_KEY,
    parse_group_samples,
    parse_memory_samples,
    parse_oom_samples,
)
from raylens.telemetry.scraping._engine import _MAX_KEPT_BYTES, _WANTED_SERIES

REAL = "c8aad7fbd30b76415162e3abb12a54563da817ce5ed531a5483380a3"
EVIL = "0" * 56
PAD = 'SessionName="session_2026-12-01_20-50-27_391290_12532",Version="2.60.0"'


def _real_lines() -> list[bytes]:
    lines = [
        f'ray_node_mem_total{{ip="10.0.0.1",{PAD}}} 6.4e+10',
        f'ray_node_mem_used{{ip="10.0.0.1",{PAD}}} 3.2e+10',
        f'ray_memory_manager_worker_eviction_total{{Component="raylet",Name="f",Type="Task",{PAD}}} 2',
        f'ray_raylens_sampler_sampled_at_seconds{{{PAD},WorkerId="{REAL}"}} 1.7e+09',
    ]
    for group in ("policy", "rollout", "reward"):
        labels = f'{PAD},WorkerId="{REAL}",memory_type="rss",rl_worker_group="{group}"'
        lines.append(f"ray_raylens_worker_group_memory_bytes{{{labels}}} 2e+09")
    return [(line + "\n").encode() for line in lines]


def _look_alikes(count: int) -> list[bytes]:
    lines = []
    for index in range(count):
        group = f"forged-{index:06d}"
        labels = f'{PAD},WorkerId="{EVIL}",memory_type="rss",rl_worker_group="{group}"'
        lines += [
            f"ray_raylens_worker_group_memory_bytes{{{labels}}} 1e+09",  # the real name
            f"ray_raylens_worker_group_memory_bytes_x{{{labels}}} 1",  # a longer name
            f"# HELP ray_node_mem_used {group} ray_raylens_worker_group_memory_bytes",
            'other_series{note="ray_node_mem_used ray_raylens_node_oom_kills"} 1',
        ]
    return [(line + "\n").encode() for line in lines]


def _kept(lines: list[bytes]) -> bytes:
    wanted = WantedLines(
        _WANTED_SERIES, max_kept_bytes=_MAX_KEPT_BYTES, source_label=RAY_WORKER_ID_LABEL
    )
    body = b"".join(lines)
    for start in range(0, len(body), 64 * 1024):
        wanted.feed(body[start : start + 64 * 1024])
    assert len(wanted.payload()) <= _MAX_KEPT_BYTES
    return wanted.payload()


@pytest.mark.parametrize("order", ["flood first", "flood last", "shuffled"])
def test_real_group_series_and_kill_counters_survive_any_order_and_volume_of_look_alikes(
    order: str,
) -> None:
    flood, real = _look_alikes(3000), _real_lines()  # ~2.5 MB of look-alikes
    if order == "flood first":
        lines = flood + real
    elif order == "flood last":
        lines = real + flood
    else:
        lines = flood + real
        random.Random(7).shuffle(lines)
    kept = _kept(lines)

    values = parse_memory_samples(kept)
    assert values[USED_KEY] == 3.2e10 and values[TOTAL_KEY] == 6.4e10
    oom = parse_oom_samples(kept)
    assert oom is not None and oom.ray_evictions == 2
    figures = parse_group_samples(kept)
    assert figures is not None
    assert {row[0] for row in figures.rows} == {"policy", "rollout", "reward"}


def test_lines_that_only_look_like_wanted_ones_take_no_room() -> None:
    wanted = WantedLines(["ray_node_mem_used"], max_kept_bytes=1024)
    wanted.feed(b"# HELP ray_node_mem_used x\n" * 100)
    wanted.feed(b"ray_node_mem_used_host 1\n" * 100)
    wanted.feed(b'x{a="ray_node_mem_used"} 1\n' * 100)
    wanted.feed(b"ray_node_mem_used 5\n")
    assert wanted.payload() == b"ray_node_mem_used 5\n"
    assert not wanted.overflowed


def test_many_flooding_processes_never_push_out_the_nodes_own_series() -> None:
    flood = []
    for worker in range(200):  # more publishing processes than get a share of their own
        labels = f'{PAD},WorkerId="{worker:056d}",memory_type="rss"'
        flood += [
            f'ray_raylens_worker_group_memory_bytes{{{labels},rl_worker_group="g{n}"}} 1\n'.encode()
            for n in range(40)
        ]
    kept = _kept(flood + _real_lines())
    values = parse_memory_samples(kept)
    assert values[USED_KEY] == 3.2e10 and values[TOTAL_KEY] == 6.4e10
    oom = parse_oom_samples(kept)
    assert oom is not None and oom.ray_evictions == 2
