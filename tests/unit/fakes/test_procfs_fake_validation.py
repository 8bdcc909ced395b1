"""The fake /proc refuses a bad process without leaving half of it behind."""

from __future__ import annotations

import pytest

from raylens_fakes.procfs import FakeProcFS


def test_unknown_parent_thread_leaves_no_process_behind(tmp_path) -> None:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, threads=[110])
    with pytest.raises(ValueError, match=r"pid 100 has no thread 999.*\[100, 110\]"):
        fake.add_process(101, parent=100, tid=999)
    assert not (fake.root / "101").exists()
    fake.add_process(101, parent=100, tid=110)  # the same pid can be added correctly
    assert (fake.root / "100" / "task" / "110" / "children").read_text().split() == ["101"]
