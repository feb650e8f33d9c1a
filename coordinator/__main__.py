"""``python -m coordinator``: the ``txcoord`` command line (:mod:`coordinator.cli`)."""

import sys

from coordinator.cli import main

sys.exit(main())
