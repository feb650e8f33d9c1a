"""Azurite, Microsoft's Azure Storage emulator, on loopback: the Azure lakehouse of the tests.

Only its Blob service runs (``azurite-blob``): the API that obstore and delta-rs speak to Azure Blob
Storage and ADLS Gen2 alike (object_store reads and writes an ``abfss://`` location through the Blob
endpoint). It implements the conditional writes the lakehouse relies on, ``If-None-Match: *`` and
``If-Match``. It serves the well-known emulator account ``devstoreaccount1`` and its published key,
path-style (``http://127.0.0.1:PORT/devstoreaccount1/CONTAINER/...``).

It is installed once per machine and lock from npm into txcoord's cache (``~/.cache/txcoord/azurite/``,
``npm ci`` of ``scripts/azurite/package-lock.json``, the version and every dependency pinned with its
hash; about half a minute), and starts in a second or two. Telemetry is off: nothing leaves the machine.

    python3 -m scripts.azurite install                          # once; a no-op when cached
    .venv/bin/python -m scripts.azurite run --data /tmp/az --container lakehouse
                                                                # serves until Ctrl-C, printing the
                                                                # [storage] settings

From Python::

    with Azurite(data_dir) as azurite:
        azurite.create_container("lakehouse")
        config = CoordinatorConfig(lakehouse=azurite.location("lakehouse", "lh"), storage=azurite.storage_options)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from coordinator.conformance.loopback import LoopbackServer, install_once, required_tool, server_command, tool_cache

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = PROJECT_ROOT / "scripts" / "azurite"
#: One installation per lock: a changed lock installs again, beside the others.
CACHE_DIR = tool_cache("azurite", hashlib.sha256((PACKAGE_DIR / "package-lock.json").read_bytes()).hexdigest()[:16])
BINARY = CACHE_DIR / "node_modules" / ".bin" / "azurite-blob"
#: Written once the install is complete.
STAMP = CACHE_DIR / ".installed"
#: The emulator's one account and its key, published by Microsoft (not a secret).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def installed() -> bool:
    """Whether the cache holds Azurite as the lock pins it."""
    return BINARY.exists() and STAMP.exists()


def install(quiet: bool = False) -> Path:
    """Azurite's ``azurite-blob``, installed into the cache first if it is not there as the lock pins it.
    An install already under way in another process (``make test`` starts one early) is waited for."""
    if not installed():
        npm = required_tool("npm", "installing Azurite needs npm (sudo apt-get install nodejs npm)")
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        install_once(CACHE_DIR.parent / ".azurite-install.lock", installed, lambda: _npm_ci(npm, quiet))
    return BINARY


def _npm_ci(npm: str, quiet: bool) -> None:
    if not quiet:
        print(f"installing Azurite ({PACKAGE_DIR / 'package.json'}) into {CACHE_DIR}: about half a minute, once",
              file=sys.stderr, flush=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(PACKAGE_DIR / name, CACHE_DIR / name)
    # ci: exactly the lock, hashes checked. No install scripts: Azurite needs none (one dependency's
    # only prints), and a script is code run at install time.
    subprocess.run([npm, "ci", "--ignore-scripts", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"],
                   cwd=CACHE_DIR, check=True, stdout=subprocess.DEVNULL if quiet else None)
    STAMP.touch()


class Azurite(LoopbackServer):
    """An ``azurite-blob`` process keeping its blobs under ``data_dir``, on a free loopback port, until stopped.

    Example::

        with Azurite("/tmp/az") as azurite:
            azurite.create_container("lakehouse")
            azurite.location("lakehouse", "lh")   # 'abfss://lakehouse@devstoreaccount1.dfs.core.windows.net/lh'
    """

    name = "Azurite"

    def __init__(self, data_dir: str | os.PathLike, port: Optional[int] = None, log_file: Optional[str] = None):
        super().__init__(port, log_file)
        self.data_dir = Path(data_dir)
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def storage_options(self) -> dict[str, str]:
        """The ``[storage]`` settings (``object_store``'s keys) that reach this emulator's account.
        The endpoint, not ``azure_storage_use_emulator``: that one takes the emulator's address from
        an environment variable only, where a ``[storage]`` table should say it all."""
        return {"azure_storage_account_name": ACCOUNT, "azure_storage_account_key": ACCOUNT_KEY,
                "azure_storage_endpoint": self.endpoint, "allow_http": "true"}

    @staticmethod
    def location(container: str, prefix: str) -> str:
        """The ADLS Gen2 URL of ``prefix`` in ``container``, as a lakehouse on Azure is named (the host
        names the account; the requests go to :attr:`endpoint`)."""
        return f"abfss://{container}@{ACCOUNT}.dfs.core.windows.net/{prefix.strip('/')}"

    def start(self) -> "Azurite":
        binary = install(quiet=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # --skipApiVersionCheck: each client (object_store, Arrow's Azure SDK) sends an API version of its own,
        # which Azurite refuses when it is newer than Azurite knows.
        self.launch([str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", str(self.data_dir),
                     "--silent", "--disableTelemetry", "--skipApiVersionCheck"])
        return self

    def create_container(self, container: str) -> None:
        """Create ``container`` if it does not exist (obstore and delta-rs never create one)."""
        import pyarrow.fs as pafs

        authority = f"127.0.0.1:{self.port}"
        filesystem = pafs.AzureFileSystem(ACCOUNT, account_key=ACCOUNT_KEY, blob_storage_authority=authority,
                                          blob_storage_scheme="http", dfs_storage_authority=authority,
                                          dfs_storage_scheme="http")
        filesystem.create_dir(container)


def _described(azurite: Azurite, data: Path, containers: list[str]) -> list[str]:
    return [f"Azurite's Blob service on {azurite.endpoint}, keeping {data}; a lakehouse there "
            f"is {azurite.location(containers[0] if containers else 'CONTAINER', 'PREFIX')} with [storage]:",
            *(f'  {name} = "{value}"' for name, value in azurite.storage_options.items())]


def main(argv: Optional[list[str]] = None) -> int:
    return server_command(argv, __doc__.split("\n\n")[0], Azurite,
                          install=("install", "install Azurite into the cache (a no-op when it is there)", install),
                          data_help="the directory Azurite keeps its blobs in", port=10000,
                          made=("--container", "a container to create (repeatable)"), make=Azurite.create_container,
                          describe=_described)


if __name__ == "__main__":
    sys.exit(main())
