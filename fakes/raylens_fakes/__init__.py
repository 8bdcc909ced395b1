"""A simulated Ray cluster and an in-memory metric reader, for testing raylens and code built on it.

Installed with raylens and registered as a pytest plugin, so its fixtures
(``metrics_probe``, ``fake_cluster``, ``simulated_cluster``) are available in any
project that installs raylens. See :mod:`raylens_fakes.pytest_plugin`.
"""

from raylens_fakes.otel import MetricsProbe

__all__ = ["MetricsProbe"]
