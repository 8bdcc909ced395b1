"""A simulated Ray cluster that raylens can scrape without Ray: the engine behind ``raylens simulate``.

Four pieces, each in its own module:

* :mod:`raylens.simulation.raylet` - :class:`FakeRaylet`, a real HTTP server on
  127.0.0.1 that serves a recorded Ray raylet metrics page (bundled under
  ``payloads/``) and can be told to misbehave.
* :mod:`raylens.simulation.scripted_cluster` - :class:`FakeCluster`, a
  :class:`raylens.cluster.ClusterView` whose nodes and placement groups are plain
  records the caller edits.
* :mod:`raylens.simulation.simulated_cluster` - :class:`SimulatedCluster`, N fake
  raylets behind one scripted cluster, with memory that follows a schedule.
* :mod:`raylens.simulation.memory_script` - :class:`~raylens.simulation.memory_script.MemoryScript`,
  memory per worker group per node over simulated time: leaks, allocator sawtooth, phase
  steps, spikes; its ``schedule`` and ``groups`` drive a :class:`SimulatedCluster`.

The test helpers in ``raylens_fakes`` re-export these names at their old paths.
"""

from raylens.simulation.raylet import FakeRaylet
from raylens.simulation.scripted_cluster import FakeCluster, FakePlacementGroup
from raylens.simulation.simulated_cluster import SimulatedCluster

__all__ = ["FakeCluster", "FakePlacementGroup", "FakeRaylet", "SimulatedCluster"]
