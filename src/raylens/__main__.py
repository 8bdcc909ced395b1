"""``python -m raylens``: the same as the ``raylens`` command."""

import sys

from raylens.cli import main

sys.exit(main())
