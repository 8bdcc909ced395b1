"""The worker class of the example drivers, in a module of its own.

A Ray worker process does not run the driver's script: it imports the class it is
asked to start by its dotted path (``workers.MemoryWorker``). A class defined in the
driver script lives in ``__main__``, which in a worker is Ray's own entry point, so
the lookup fails there (``module '__main__' has no attribute ...``). Keeping the class
in an importable module fixes that; the drivers also ship this file to every node
(``runtime_env={"py_modules": [...]}``), so it imports on machines that do not have
this checkout.

This module imports nothing from Ray at import time, so it can be read and tested
where Ray is not installed.
"""

from __future__ import annotations

import os
from typing import Any

_MIB = 1024 * 1024
_PAGE = 4096


class MemoryWorker:
    """A worker that holds ``megabytes`` of resident memory and says where it runs."""

    def __init__(self, megabytes: int = 32) -> None:
        self._block = bytearray(megabytes * _MIB)
        # Touch every page so that the memory is resident, not only reserved.
        for offset in range(0, len(self._block), _PAGE):
            self._block[offset] = 1

    @staticmethod
    def configure_worker(
        num_gpus: float | int, bundle_indices: Any = None
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        """Actor options, extra environment and constructor arguments for one worker.

        Two groups share every bundle in the drivers, so each worker asks for half of
        a bundle's CPU.
        """
        return {"num_cpus": 0.5}, {}, {}

    def where(self) -> dict[str, Any]:
        """The worker's group, rank and Ray node id, and how much memory it holds."""
        import ray

        return {
            "group": os.environ.get("RAYLENS_WORKER_GROUP", ""),
            "rank": int(os.environ.get("RANK", "-1")),
            "node_id": ray.get_runtime_context().get_node_id(),
            "held_bytes": len(self._block),
        }
