"""How long one sample of a 200-process tree takes: raylens against psutil.

Builds a tree (a root, a few parents, the rest leaves that block on a pipe;
forked from one small Python process, so it costs little memory), then times
one whole sample, from the root pid to the summed memory, four ways:

- raylens, RSS only: the per-thread ``children`` files, then ``statm``
- raylens, RSS + PSS: the same walk, then ``smaps_rollup``
- psutil, ``Process(root).children(recursive=True)`` then ``memory_info()``
- psutil, the same then ``memory_full_info()`` (which reads PSS)

and prints a table with the ratios. psutil finds children by reading the
parent of every process on the host, so its cost grows with the host's
process count, not only the tree's; the table says how many there were.

Run: ``.venv/bin/python benchmarks/bench_process_tree.py [--processes 200] [--repeat 30]``
Linux only. Every process of the tree is killed on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import psutil

from raylens.telemetry.process_memory import collect_process_tree_memory

# argv: total processes, parents. Leaves and parents block reading a pipe that
# only the root holds open for writing; EOF on the root's stdin closes it and the
# tree unwinds. Each process reports readiness with one byte.
TREE = r"""
import os, sys
total, parents = int(sys.argv[1]), int(sys.argv[2])
block_r, block_w = os.pipe()
ready_r, ready_w = os.pipe()
leaves = total - 1 - parents
shares = [leaves // parents + (i < leaves % parents) for i in range(parents)]
pids = []
for share in shares:
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        kids = []
        for _ in range(share):
            kid = os.fork()
            if kid == 0:
                os.close(block_w)
                os.write(ready_w, b"r")
                os.read(block_r, 1)
                os._exit(0)
            kids.append(kid)
        os.close(block_w)
        os.write(ready_w, b"r")
        os.read(block_r, 1)
        for kid in kids:
            os.waitpid(kid, 0)
        os._exit(0)
    pids.append(pid)
waiting = total - 1
while waiting:
    waiting -= len(os.read(ready_r, waiting))
print("ready", flush=True)
sys.stdin.read()
os.close(block_w)
for pid in pids:
    os.waitpid(pid, 0)
"""


def raylens_rss(root: int) -> tuple[int, int]:
    memory = collect_process_tree_memory(root, include_pss=False)
    return memory.process_count, memory.rss_bytes


def raylens_full(root: int) -> tuple[int, int]:
    memory = collect_process_tree_memory(root)
    return memory.process_count, memory.rss_bytes


def _psutil(root: int, read: Callable[[psutil.Process], object]) -> tuple[int, int]:
    parent = psutil.Process(root)
    count = rss = 0
    for process in [parent, *parent.children(recursive=True)]:
        try:
            rss += read(process).rss  # type: ignore[attr-defined]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        count += 1
    return count, rss


def psutil_rss(root: int) -> tuple[int, int]:
    return _psutil(root, psutil.Process.memory_info)


def psutil_full(root: int) -> tuple[int, int]:
    return _psutil(root, psutil.Process.memory_full_info)


def time_sample(sample: Callable[[int], tuple[int, int]], root: int, repeat: int) -> list[float]:
    sample(root)  # warm caches and imports
    timings = []
    for _ in range(repeat):
        began = time.perf_counter()
        sample(root)
        timings.append(time.perf_counter() - began)
    return timings


def start_tree(total: int, parents: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", TREE, str(total), str(parents)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    if process.stdout.readline().strip() != "ready":
        stop_tree(process)
        raise SystemExit(f"the benchmark tree failed to start (exit code {process.poll()})")
    return process


def stop_tree(process: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        process.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # its own session: every process of the tree
    process.wait(timeout=10)
    process.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=200, help="tree size (default 200)")
    parser.add_argument("--parents", type=int, default=4, help="middle parents (default 4)")
    parser.add_argument("--repeat", type=int, default=30, help="timed samples per method")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("process-tree sampling reads Linux procfs; nothing to measure here")
        return 0
    if args.processes < args.parents + 2 or args.parents < 1 or args.repeat < 1:
        parser.error(
            f"need --parents >= 1, --processes >= parents + 2 and --repeat >= 1, got "
            f"{args.processes} processes, {args.parents} parents, {args.repeat} repeats"
        )

    tree = start_tree(args.processes, args.parents)
    try:
        root = tree.pid
        methods = [
            ("raylens RSS only (statm)", raylens_rss),
            ("raylens RSS + PSS (smaps_rollup)", raylens_full),
            ("psutil children + memory_info", psutil_rss),
            ("psutil children + memory_full_info", psutil_full),
        ]
        results = {}
        for name, sample in methods:
            count, rss = sample(root)
            if count != args.processes:
                raise SystemExit(f"{name} counted {count} processes, expected {args.processes}")
            results[name] = (time_sample(sample, root, args.repeat), rss)
        host_processes = len(psutil.pids())
        tree_pss = collect_process_tree_memory(root).pss_bytes or 0
    finally:
        stop_tree(tree)

    base = statistics.median(results[methods[0][0]][0])
    base_full = statistics.median(results[methods[1][0]][0])
    print(
        f"one sample of a {args.processes}-process tree; {host_processes} processes on this "
        f"host; median of {args.repeat}; tree PSS {tree_pss / 2**20:.0f} MiB"
    )
    print(f"{'method':<38}{'median ms':>10}{'min ms':>9}{'x RSS-only':>12}")
    for name, _ in methods:
        timings, _rss = results[name]
        median = statistics.median(timings)
        print(f"{name:<38}{median * 1e3:>10.2f}{min(timings) * 1e3:>9.2f}{median / base:>12.2f}")
    psutil_ratio = statistics.median(results[methods[2][0]][0]) / base
    full_ratio = statistics.median(results[methods[3][0]][0]) / base_full
    print(f"psutil memory_info / raylens RSS only:      {psutil_ratio:.2f}x (target >= 3)")
    print(f"psutil memory_full_info / raylens RSS+PSS:  {full_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
