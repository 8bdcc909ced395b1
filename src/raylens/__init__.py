"""raylens: where host memory goes on a Ray cluster.

Per node (scraped from every raylet), per worker group (the placement a
:class:`~raylens.distributed.worker_groups.RayWorkerGroup` reports) and per
managed process tree, exported through OpenTelemetry by :mod:`raylens.lens`.

Importing raylens never imports Ray; the Ray-backed pieces import it on first use.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
