"""Making an installed package absent for one test: ``modules_absent`` and the ``ray_absent`` fixture."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from raylens_fakes.pytest_plugin import BlockedImports, modules_absent


def test_an_absent_module_cannot_be_imported_and_each_attempt_is_recorded() -> None:
    with modules_absent("colorsys") as blocked:
        with pytest.raises(ModuleNotFoundError, match=r"'colorsys'") as raised:
            import colorsys  # noqa: F401
        assert raised.value.name == "colorsys"
        with pytest.raises(ImportError):
            importlib.import_module("colorsys")
        assert blocked.attempts == ["colorsys", "colorsys"]
    assert importlib.import_module("colorsys").__name__ == "colorsys"


def test_submodules_are_absent_with_their_package_and_restored_after() -> None:
    import email.mime.text

    package, submodule = sys.modules["email"], sys.modules["email.mime.text"]
    with modules_absent("email") as blocked:
        assert "email" not in sys.modules and "email.mime.text" not in sys.modules
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("email.mime.text")
        assert blocked.attempts == ["email"]
    assert sys.modules["email"] is package
    assert sys.modules["email.mime.text"] is submodule
    assert email.mime.text is submodule


def test_only_the_named_module_and_what_is_under_it_are_absent() -> None:
    with modules_absent("xml.dom") as blocked:
        assert importlib.import_module("xml.etree.ElementTree").__name__ == "xml.etree.ElementTree"
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("xml.dom.minidom")
        assert blocked.attempts == ["xml.dom"]
    assert importlib.import_module("xml.dom.minidom").__name__ == "xml.dom.minidom"


def test_what_was_put_under_the_name_during_the_block_is_gone_after_it() -> None:
    assert "raylens_absent_probe" not in sys.modules
    with modules_absent("raylens_absent_probe"):
        sys.modules["raylens_absent_probe"] = types.ModuleType("raylens_absent_probe")
    assert "raylens_absent_probe" not in sys.modules


def test_the_finder_is_removed_even_when_the_block_fails() -> None:
    finders = list(sys.meta_path)
    with pytest.raises(RuntimeError, match="inside"), modules_absent("colorsys"):
        raise RuntimeError("inside")
    assert sys.meta_path == finders
    importlib.import_module("colorsys")


@pytest.mark.parametrize("names", [(), ("",), ("ray.",), (".ray",), (3,)])
def test_a_name_that_is_no_module_name_is_refused(names: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match=r"module names"), modules_absent(*names):  # type: ignore[arg-type]
        pass


def test_the_ray_absent_fixture_hides_ray_whether_or_not_it_is_installed(
    ray_absent: BlockedImports,
) -> None:
    assert "ray" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        import ray  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        from ray.util import placement_group_table  # noqa: F401
    assert ray_absent.attempts == ["ray", "ray"]
