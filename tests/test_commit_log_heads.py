"""Finding a commit log's latest version by probing its commit files, as the lag gauge and ``txcoord status`` do."""

from __future__ import annotations

import pytest

from coordinator.commit_logs import versions_written
from coordinator.lakehouse import delta_log_file
from coordinator.storage import FileStore

KEY = "groups/g/commit_log"


class CountingFiles:
    """A lakehouse's files, counting the existence checks made."""

    def __init__(self, files: FileStore):
        self.files, self.checks = files, 0

    def exists(self, key: str) -> bool:
        self.checks += 1
        return self.files.exists(key)


@pytest.mark.parametrize("versions", [0, 1, 2, 3, 17, 64, 1000])
def test_the_latest_version_is_found_from_any_known_one(tmp_path, versions):
    files = FileStore.at(str(tmp_path))
    for version in range(versions):
        files.put(f"{KEY}/{delta_log_file(version)}", b"{}")
    for known in sorted({0, versions // 2, max(versions - 1, 0), versions}):
        counting = CountingFiles(files)
        assert versions_written(counting, KEY, known) == versions, known
        assert counting.checks <= 2 * (versions - known).bit_length() + 2  # a handful, not one per version
