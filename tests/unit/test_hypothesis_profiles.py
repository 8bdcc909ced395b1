"""Property tests draw few examples per interpreter and many once in CI (HYPOTHESIS_PROFILE=ci)."""

from __future__ import annotations

import os

from hypothesis import settings


def test_the_quick_default_draws_fewer_examples_than_ci_and_neither_has_a_deadline() -> None:
    quick, ci = settings.get_profile("quick"), settings.get_profile("ci")
    assert quick.max_examples < ci.max_examples
    assert quick.deadline is None and ci.deadline is None


def test_the_profile_in_force_is_the_one_the_environment_names() -> None:
    chosen = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
    assert settings.default.max_examples == chosen.max_examples
    assert settings.default.deadline == chosen.deadline
