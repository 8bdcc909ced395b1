"""Memory per training phase, the part that needs no Ray.

- :mod:`.memory`: each group's start, end and peak over a phase on one node
  (:class:`~.memory.NodePhaseTracker`), the table of the latest run of every phase name and
  its gauges, and the log line;
- :mod:`.board`: the current phase of every job, and the summary of its last ended phase,
  in the cluster's key-value store, so that any process on the cluster can show them;
- :mod:`.log`: the JSON-lines phase log (``RAYLENS_PHASE_LOG``) and the summary a driver
  with no logging set up still sees.

``raylens.phase`` drives them from the driver: :mod:`raylens.distributed.phases`.
"""

__all__: list[str] = []
