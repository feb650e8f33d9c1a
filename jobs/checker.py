"""``spark-submit jobs/checker.py --config conf/coordinator.toml``: the checker job of
:mod:`coordinator.jobs.checker` (installed, it is ``txcoord checker``)."""

import sys

from coordinator.jobs.checker import main

if __name__ == "__main__":
    sys.exit(main())
