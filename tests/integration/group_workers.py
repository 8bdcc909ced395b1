"""Worker classes the integration tests start as Ray actors, and functions to wait on them.

The classes are imported by fully qualified name (``group_workers.EnvWorker``) on the
Ray nodes, which find this directory through the ``PYTHONPATH`` the session cluster
hands its workers (see ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray


def _rank() -> int:
    return int(os.environ.get("RANK", "-1"))


@ray.remote
class EnvWorker:
    """Reports its environment, placement and arguments; echoes calls back with its rank."""

    @staticmethod
    def configure_worker(
        num_gpus: float, bundle_indices: Any = None, num_gpus_per_node: int | None = None
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        env = {"FROM_CONFIGURE": "yes", "OVERRIDE_ME": "configure"}
        seen = {
            "num_gpus": num_gpus,
            "bundle_indices": bundle_indices,
            "num_gpus_per_node": num_gpus_per_node,
        }
        return {}, env, {"configured_with": seen}

    def __init__(
        self,
        tag: str = "",
        marker_dir: str | None = None,
        configured_with: dict[str, Any] | None = None,
    ) -> None:
        self.tag = tag
        self.marker_dir = marker_dir
        self.configured_with = configured_with

    def env(self, *names: str) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}

    def init_info(self) -> dict[str, Any]:
        return {"tag": self.tag, "configured_with": self.configured_with}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def echo(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"rank": _rank(), "args": list(args), "kwargs": kwargs}

    def count_up(self, n: int):  # a generator method: callers get an ObjectRefGenerator
        for i in range(n):
            yield (_rank(), i)

    def cleanup(self) -> str:
        rank = _rank()
        if self.marker_dir is not None:
            Path(self.marker_dir, f"cleaned-{rank}").write_text(self.tag)
        if self.tag == "hang-on-odd" and rank % 2 == 1:
            threading.Event().wait()  # never returns: a cleanup that hangs
        return f"cleaned {rank}"


@ray.remote(runtime_env={"env_vars": {"FROM_DECORATOR": "decorator"}})
class NemoStyleWorker:
    """A NeMo-RL worker: its decorator sets an environment variable, and its
    ``configure_worker`` returns runtime_env overrides as a fourth item."""

    @staticmethod
    def configure_worker(
        num_gpus: float, bundle_indices: Any = None
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], dict[str, Any]]:
        return {}, {"FROM_CONFIGURE": "yes"}, {}, {"env_vars": {"FROM_OVERRIDES": "yes"}}

    def env(self, *names: str) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


class PlainWorker:
    """Not decorated with ``@ray.remote``: the initializer makes it remote itself."""

    def __init__(self, greeting: str = "hi") -> None:
        self.greeting = greeting

    def greet(self) -> str:
        return f"{self.greeting} from {_rank()}"


# ---- waiting, on the driver ----------------------------------------------------------------


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def is_dead(actor: Any, timeout: float = 30.0) -> bool:
    """True once Ray reports ``actor`` dead; False if it answers a call within ``timeout``."""
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=timeout)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        return False
    return False


def wait_until_dead(actor: Any, timeout: float = 30.0) -> None:
    """Block until Ray reports ``actor`` dead; fail if it is still alive after ``timeout``."""
    wait_for(lambda: is_dead(actor, timeout), timeout, f"actor {actor} to die")


@contextlib.contextmanager
def policy_and_rollout(name: str) -> Iterator[dict[str, Any]]:
    """The groups ``policy`` and ``rollout`` (``EnvWorker``) sharing two one-CPU bundles.

    Shut down, with their virtual cluster ``name``, on the way out. raylens is imported
    here rather than at the top: the Ray workers import this module for its classes only.
    """
    from raylens.distributed.virtual_cluster import RayVirtualCluster
    from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup

    cluster = RayVirtualCluster(
        [1, 1], use_gpus=False, name=name, placement_timeout_s=60, max_colocated_worker_groups=2
    )
    made: dict[str, Any] = {}
    try:
        for group in ("policy", "rollout"):
            made[group] = RayWorkerGroup(
                cluster, RayWorkerBuilder("group_workers.EnvWorker"), name_prefix=group
            )
        yield made
    finally:
        for worker_group in made.values():
            worker_group.shutdown()
        cluster.shutdown()
