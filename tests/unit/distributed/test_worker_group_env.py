"""Worker environment and actor options: who wins, and what is never modified."""

from __future__ import annotations

import pytest

from raylens.distributed import worker_groups as wg
from raylens.distributed import worker_planning as wp

DIST = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "NODE_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_checked_env_vars_copies_and_validates() -> None:
    source = {"A": "1"}
    checked = wp._checked_env_vars(source)
    checked["B"] = "2"
    assert source == {"A": "1"}
    assert wp._checked_env_vars(None) == {}
    with pytest.raises(ValueError, match=r"'A': 1"):
        wp._checked_env_vars({"A": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"mapping"):
        wp._checked_env_vars([("A", "1")])  # type: ignore[arg-type]


def test_driver_env_drops_driver_only_and_rank_variables() -> None:
    environ = {
        "HOME": "/root",
        "PYTHONPATH": "/src",
        "CUDA_VISIBLE_DEVICES": "0",
        "RAY_ADDRESS": "x:1",
        "RANK": "9",
        "PYTEST_CURRENT_TEST": "t",
        "RAY_DEDUP_LOGS": "0",
    }
    assert wp._driver_env(environ) == {"HOME": "/root", "PYTHONPATH": "/src", "RAY_DEDUP_LOGS": "0"}


def test_driver_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYLENS_TEST_MARKER", "yes")
    assert wp._driver_env()["RAYLENS_TEST_MARKER"] == "yes"


def test_worker_env_precedence() -> None:
    driver = {"A": "driver", "B": "driver", "RANK": "driver", "ONLY_DRIVER": "d"}
    group = {"A": "group", "RANK": "group", "ONLY_GROUP": "g"}
    env = wp._worker_env_vars(driver, group, DIST)
    assert env["A"] == "group"
    assert env["B"] == "driver"
    assert env["RANK"] == "3"
    assert env["ONLY_DRIVER"] == "d" and env["ONLY_GROUP"] == "g"
    assert driver["A"] == "driver" and group["RANK"] == "group"


def test_initializer_env_leaves_out_rank_variables_and_copies() -> None:
    env = {"PYTHONPATH": "/src", "A": "1", **DIST}
    initializer_env = wp._get_initializer_env_vars(env)
    assert initializer_env == {"PYTHONPATH": "/src", "A": "1"}
    initializer_env["Z"] = "z"
    assert "Z" not in env and env["RANK"] == "3"


# ---- configure_worker -----------------------------------------------------------------


class Worker:
    calls: list[dict[str, object]] = []

    @staticmethod
    def configure_worker(num_gpus, bundle_indices=None, num_gpus_per_node=None):  # type: ignore[no-untyped-def]
        Worker.calls.append(
            {"num_gpus": num_gpus, "bundle_indices": bundle_indices, "per_node": num_gpus_per_node}
        )
        return {"num_gpus": 0.5}, {"FROM_WORKER": "1", "A": "worker"}, {"mode": "fast"}


class OldStyleWorker:
    @staticmethod
    def configure_worker(num_gpus, bundle_indices=None):  # type: ignore[no-untyped-def]
        return None, None, None


def test_call_configure_worker_passes_topology_when_accepted() -> None:
    Worker.calls.clear()
    configured = wg._call_configure_worker(Worker, 1, (0, [0, 1]), 8)
    assert configured == (
        {"num_gpus": 0.5},
        {"FROM_WORKER": "1", "A": "worker"},
        {"mode": "fast"},
        {},
    )
    assert Worker.calls == [{"num_gpus": 1, "bundle_indices": (0, [0, 1]), "per_node": 8}]


def test_call_configure_worker_old_signature_and_none_parts() -> None:
    assert wg._call_configure_worker(OldStyleWorker, 1, None, 8) == ({}, {}, {}, {})


class NemoStyleWorker:
    """A NeMo-RL worker: configure_worker also returns runtime_env overrides."""

    @staticmethod
    def configure_worker(num_gpus, bundle_indices=None):  # type: ignore[no-untyped-def]
        return {"num_gpus": num_gpus}, {"E": "1"}, {}, {"py_executable": "uv run"}


def test_call_configure_worker_accepts_the_four_item_form() -> None:
    configured = wg._call_configure_worker(NemoStyleWorker, 1, None, 8)
    assert configured == ({"num_gpus": 1}, {"E": "1"}, {}, {"py_executable": "uv run"})


def test_runtime_env_overrides_are_merged_into_the_actor_runtime_env() -> None:
    extra = {"runtime_env": {"env_vars": {"A": "group"}, "py_executable": "python"}}
    configured = ({}, {"B": "worker"}, {}, {"py_executable": "uv run", "env_vars": {"C": "c"}})
    options, _, messages = wg._apply_worker_configuration(extra, 0, {}, configured, STRATEGY)
    assert options["runtime_env"] == {
        "py_executable": "uv run",
        "env_vars": {"A": "group", "B": "worker", "C": "c"},
    }
    assert any("runtime_env['py_executable']='uv run' over 'python'" in m for m in messages)
    assert extra["runtime_env"] == {"env_vars": {"A": "group"}, "py_executable": "python"}


def test_decorator_options_are_the_lowest_layer_and_merged() -> None:
    decorator = {
        "num_cpus": 2,
        "runtime_env": {"env_vars": {"ONLY_DECORATOR": "d", "A": "decorator"}, "pip": ["x"]},
    }
    extra = {"runtime_env": {"env_vars": {"A": "group"}}}
    configured = ({}, {"B": "worker"}, {}, {})
    options, _, messages = wg._apply_worker_configuration(
        extra, 0, {}, configured, STRATEGY, decorator
    )
    assert options["runtime_env"] == {
        "pip": ["x"],
        "env_vars": {"ONLY_DECORATOR": "d", "A": "group", "B": "worker"},
    }
    assert messages == []  # the caller outranking the decorator is not an override
    assert decorator["runtime_env"]["env_vars"] == {"ONLY_DECORATOR": "d", "A": "decorator"}


def test_call_configure_worker_absent() -> None:
    assert wg._call_configure_worker(object, 1, None, 8) is None


def test_call_configure_worker_bad_return() -> None:
    class Bad:
        @staticmethod
        def configure_worker(num_gpus, bundle_indices=None):  # type: ignore[no-untyped-def]
            return {"num_gpus": 1}

    with pytest.raises(TypeError, match=r"Bad\.configure_worker.*\(resources, env_vars"):
        wg._call_configure_worker(Bad, 1, None, None)

    class BadPart:
        @staticmethod
        def configure_worker(num_gpus, bundle_indices=None):  # type: ignore[no-untyped-def]
            return {}, ["A"], {}

    with pytest.raises(TypeError, match=r"env_vars=\['A'\]"):
        wg._call_configure_worker(BadPart, 1, None, None)


STRATEGY = object()


def test_apply_configuration_precedence() -> None:
    extra = {
        "runtime_env": {"env_vars": {"A": "group", "RANK": "3"}},
        "name": "w-0-0",
        "num_cpus": 1,
        "scheduling_strategy": "SPREAD",
    }
    configured = ({"num_gpus": 0.5, "num_cpus": 1}, {"A": "worker", "NEW": "n"}, {"mode": "fast"})
    options, kwargs, messages = wg._apply_worker_configuration(
        extra, 1, {"mode": "slow", "size": 2}, configured, STRATEGY
    )
    assert options["num_gpus"] == 0.5
    assert options["num_cpus"] == 1
    assert options["name"] == "w-0-0"
    assert options["runtime_env"]["env_vars"] == {"A": "worker", "RANK": "3", "NEW": "n"}
    assert options["scheduling_strategy"] is STRATEGY
    assert kwargs == {"mode": "fast", "size": 2}
    joined = "\n".join(messages)
    assert "num_gpus=0.5 over 1" in joined
    assert "A='worker' over 'group'" in joined
    assert "'mode'" in joined
    assert "scheduling_strategy is ignored" in joined
    assert "num_cpus" not in joined  # same value: nothing overridden
    # inputs untouched
    assert extra["runtime_env"] == {"env_vars": {"A": "group", "RANK": "3"}}
    assert extra["scheduling_strategy"] == "SPREAD"


def test_apply_configuration_without_configure_worker() -> None:
    options, kwargs, messages = wg._apply_worker_configuration({}, 0, {"k": 1}, None, STRATEGY)
    assert options == {"num_gpus": 0, "scheduling_strategy": STRATEGY}
    assert kwargs == {"k": 1}
    assert messages == []


# ---- importing worker classes ---------------------------------------------------------


def test_import_by_fqn_module_attribute_and_nested_class() -> None:
    import collections

    assert wg._import_by_fqn("collections.OrderedDict") is collections.OrderedDict
    assert (
        wg._import_by_fqn(
            "raylens.distributed.worker_groups.RayWorkerBuilder.IsolatedWorkerInitializer"
        )
        is wg.RayWorkerBuilder.IsolatedWorkerInitializer
    )


def test_import_by_fqn_errors() -> None:
    with pytest.raises(ValueError, match=r"fully qualified"):
        wg._import_by_fqn("Worker")
    with pytest.raises(ImportError, match=r"no attribute path 'Nope'"):
        wg._import_by_fqn("collections.Nope")
    with pytest.raises(ImportError, match=r"no importable module"):
        wg._import_by_fqn("raylens_no_such_package.mod.Worker")


def test_a_class_in_main_is_explained() -> None:
    with pytest.raises(ImportError) as caught:
        wg._import_by_fqn("__main__.RaylensNoSuchEcho")
    message = str(caught.value)
    assert "__main__" in message and "importable by the workers" in message
    assert "working_dir" in message and "class object" in message


def test_builder_accepts_the_class_object() -> None:
    class Echo:
        pass

    builder = wg.RayWorkerBuilder(Echo, 1)
    assert builder.ray_actor_class_fqn.endswith("Echo")
    initializer = wg.RayWorkerBuilder.IsolatedWorkerInitializer(Echo)
    assert initializer._worker_class() is Echo


def test_import_by_fqn_keeps_a_broken_dependency_visible(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pathlib

    root = pathlib.Path(str(tmp_path))
    (root / "raylens_broken_mod.py").write_text("import raylens_missing_dependency\n")
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(ModuleNotFoundError, match=r"raylens_missing_dependency"):
        wg._import_by_fqn("raylens_broken_mod.Worker")


def test_builder_validates_fqn_and_keeps_arguments() -> None:
    with pytest.raises(ValueError, match=r"'Worker'"):
        wg.RayWorkerBuilder("Worker")
    builder = wg.RayWorkerBuilder("pkg.mod.Worker", 1, mode="x")
    assert builder.ray_actor_class_fqn == "pkg.mod.Worker"
    assert builder.args == (1,)
    assert builder.kwargs == {"mode": "x"}


def test_initializer_keeps_constructor_arguments() -> None:
    initializer = wg.RayWorkerBuilder.IsolatedWorkerInitializer("pkg.mod.Worker", 1, a=2)
    assert initializer.ray_actor_class_fqn == "pkg.mod.Worker"
    assert initializer.init_args == (1,)
    assert initializer.init_kwargs == {"a": 2}
