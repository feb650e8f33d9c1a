"""``python jobs/credits.py --config demo-lakehouse/demo.toml``: the demo's credits service,
:mod:`coordinator.demo.credits`."""

import sys

from coordinator.demo.credits import main

if __name__ == "__main__":
    sys.exit(main())
