"""The ``raylens`` command's entry point, :func:`main` (defined in :mod:`raylens.cli.entry`).

Invariant: this package's face imports nothing heavy: only :mod:`raylens.cli.entry`, which
loads ``signal``, ``sys`` and ``collections.abc``. The parts of the command (``app`` and
what it loads) are imported inside :func:`main`, after Ctrl-C is set to note itself, so
that a Ctrl-C typed while they load still ends the command quietly with status 130.

The commands, their flags and exit statuses: the README's *The commands*; what each
module of this package does: ``docs/architecture.md``, *Entry points and the command*.
"""

from raylens.cli.entry import main

__all__ = ["main"]
