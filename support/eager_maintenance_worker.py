"""The scheduled maintenance's worker process, compacting commit logs as the ``commit_logs_compacted_eagerly``
fixture (support/fixtures.py) has maintenance do in the tests' own process."""

from datetime import timedelta

import coordinator.ops.maintenance as maintenance
from coordinator.jobs.maintenance import _worker_main

if __name__ == "__main__":
    maintenance.COMMIT_LOG_COMPACTION_AGE, maintenance.COMMIT_LOG_COMPACTION_MIN_FILES = timedelta(0), 2
    _worker_main()
