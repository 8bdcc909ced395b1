"""Every test starts from a clean raylens: no telemetry pipeline, no warnings remembered,
no host-memory monitor or worker-group placement, no profiler state.

Property tests (hypothesis) follow one of two profiles: ``quick``, the default, draws a
few examples so each interpreter's run stays short; ``ci``, chosen with
``HYPOTHESIS_PROFILE=ci`` (tox's slow env sets it), draws many, once. Neither has a
per-example deadline, so a busy machine cannot fail an example for being slow.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from raylens_fakes.pytest_plugin import reset_raylens_state

settings.register_profile("quick", max_examples=10, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(autouse=True)
def _clean_raylens() -> Iterator[None]:
    reset_raylens_state()
    yield
    reset_raylens_state()
