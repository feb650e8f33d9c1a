"""A real S3-compatible server on loopback: the lakehouse of ``txcoord conformance --object-store``, and that of
the tests, the benchmarks and the chaos harness.

The server is `versitygw <https://github.com/versity/versitygw>`_ (Apache 2.0) with its POSIX
backend: each bucket a directory, each object a file. It implements the conditional writes the
lakehouse relies on (``If-None-Match: *`` and ``If-Match``), atomically: it re-checks the
condition and publishes the object under a per-object file lock, so of several racing writers
exactly one wins (checked here with 16 concurrent PUTs on one key, 20 rounds).

It is built once per machine from the Go module proxy into txcoord's cache (``~/.cache/txcoord/s3/``,
about a minute and a half on two cores; the Go caches are removed afterwards; it needs Go), then started in a
fraction of a second. Python's standard library only at import (pyarrow when a bucket is made): a checkout's
``make test`` builds it before its virtual environment exists.

    python -m coordinator.conformance.versitygw build                # once; a no-op when cached
    python -m coordinator.conformance.versitygw run --data /tmp/s3 --bucket lakehouse
                                                                     # serves until Ctrl-C, printing
                                                                     # the AWS_* variables to export

From Python::

    with S3Server(data_dir) as server:
        server.create_bucket("lakehouse")
        config = CoordinatorConfig(lakehouse="s3://lakehouse/lh", storage=server.storage_options)

With accounts (``with_accounts=True``), the server keeps an account store of its own: the root
account (``storage_options``) owns the buckets and sets their policies; ``create_account`` adds a
user whose requests a bucket policy naming its account grants (or not), as S3 does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from coordinator.conformance.loopback import LoopbackServer, install_once, required_tool, server_command, tool_cache
from coordinator.exceptions import ConformanceKitError

__all__ = ["ACCESS_KEY", "BINARY", "BUILD_COMMAND", "REGION", "S3Server", "SECRET_KEY", "build", "main"]

#: The one version the Go module proxy lists; built from source, so the pin is the module version.
VERSITYGW_MODULE = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"
CACHE_DIR = tool_cache("s3", "versitygw-" + VERSITYGW_MODULE.rpartition("@")[2])
BINARY = CACHE_DIR / "bin" / "versitygw"
#: What builds it: the command an error names where it is missing.
BUILD_COMMAND = "python -m coordinator.conformance.versitygw build"
ACCESS_KEY = "txcoord"
SECRET_KEY = "txcoord-secret"
REGION = "us-east-1"


def build(quiet: bool = False) -> Path:
    """The server's binary, built into the cache first if it is not there yet. A build already
    under way in another process (``make test`` starts one early) is waited for, not repeated."""
    if not BINARY.exists():
        go = required_tool("go", "building the S3 server needs Go (https://go.dev/dl/)")
        install_once(CACHE_DIR / ".build.lock", BINARY.exists, lambda: _go_install(go, quiet))
    return BINARY


def _go_install(go: str, quiet: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="txcoord-go-", dir=CACHE_DIR.parent) as work:
        env = dict(os.environ, GOBIN=str(BINARY.parent), GOMODCACHE=f"{work}/mod", GOCACHE=f"{work}/build",
                   GOFLAGS="-buildvcs=false -modcacherw", CGO_ENABLED="0")
        if not quiet:
            print(f"building the S3 server ({VERSITYGW_MODULE}) into {BINARY.parent}: about a minute and a half, once",
                  file=sys.stderr, flush=True)
        BINARY.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([go, "install", "-ldflags=-s -w", VERSITYGW_MODULE], env=env, check=True)


class S3Server(LoopbackServer):
    """A versitygw process serving ``data_dir`` on a free loopback port, until stopped.

    Example::

        with S3Server("/tmp/s3") as server:
            server.create_bucket("lakehouse")
            server.endpoint        # 'http://127.0.0.1:41234'
    """

    name = "the S3 server"

    def __init__(self, data_dir: str | os.PathLike, port: Optional[int] = None, log_file: Optional[str] = None,
                 with_accounts: bool = False, sidecar: bool = False):
        super().__init__(port, log_file)
        self.data_dir = Path(data_dir)
        self.accounts_dir = self.data_dir.parent / f"{self.data_dir.name}-accounts" if with_accounts else None
        # Metadata (a bucket's policy among it) in files of their own rather than in extended attributes: ext4 keeps
        # at most a block (4 KB) of those per file, less than the policy of a lakehouse with a few consumer groups.
        # (Not named after the data directory: versitygw refuses one whose path merely begins with the data's.)
        self.sidecar_dir = self.data_dir.parent / f"metadata-of-{self.data_dir.name}" if sidecar else None
        self.endpoint = f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, str]:
        """The ``[storage]`` settings (``object_store``'s keys) that reach this server as its root account."""
        return self.storage_options_of(ACCESS_KEY, SECRET_KEY)

    def storage_options_of(self, access_key: str, secret_key: str) -> dict[str, str]:
        """The ``[storage]`` settings that reach this server as the account ``access_key``."""
        return {"aws_endpoint": self.endpoint, "aws_access_key_id": access_key, "aws_secret_access_key": secret_key,
                "aws_region": REGION, "aws_allow_http": "true"}

    def create_account(self, access_key: str, secret_key: str) -> dict[str, str]:
        """Add the (non-admin) account ``access_key`` to a server started ``with_accounts``; return its
        ``[storage]`` settings. It may do only what bucket policies grant it."""
        if self.accounts_dir is None:
            raise ConformanceKitError("this S3 server was started without accounts (with_accounts=False)")
        subprocess.run([str(build()), "admin", "--access", ACCESS_KEY, "--secret", SECRET_KEY, "--endpoint-url",
                        self.endpoint, "create-user", "--access", access_key, "--secret", secret_key, "--role", "user"],
                       check=True, capture_output=True)
        return self.storage_options_of(access_key, secret_key)

    @property
    def environment(self) -> dict[str, str]:
        """The same settings as the ``AWS_*`` environment variables that delta-rs, obstore and pyarrow read."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def start(self) -> "S3Server":
        binary = build()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        accounts = []
        if self.accounts_dir is not None:
            self.accounts_dir.mkdir(parents=True, exist_ok=True)
            accounts = ["--iam-dir", str(self.accounts_dir)]
        sidecar = []
        if self.sidecar_dir is not None:
            self.sidecar_dir.mkdir(parents=True, exist_ok=True)
            sidecar = ["--sidecar", str(self.sidecar_dir)]
        self.launch([str(binary), "--access", ACCESS_KEY, "--secret", SECRET_KEY, "--region", REGION,
                     "--port", f"127.0.0.1:{self.port}", *accounts, "--quiet", "posix", *sidecar, str(self.data_dir)])
        return self

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (a directory of the POSIX backend) if it does not exist."""
        import pyarrow.fs as pafs

        filesystem = pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION, scheme="http",
                                       endpoint_override=f"127.0.0.1:{self.port}", allow_bucket_creation=True)
        filesystem.create_dir(bucket)


def _described(server: S3Server, data: Path, buckets: list[str]) -> list[str]:
    return [f"S3 server on {server.endpoint}, serving {data}; for txcoord, export:",
            *(f"  export {name}={value}" for name, value in server.environment.items())]


def main(argv: Optional[list[str]] = None) -> int:
    return server_command(argv, __doc__.split("\n\n")[0], S3Server,
                          install=("build", "build the server into the cache (a no-op when it is there)", build),
                          data_help="the directory served: one subdirectory per bucket", port=9000,
                          made=("--bucket", "a bucket to create (repeatable)"), make=S3Server.create_bucket,
                          describe=_described)


if __name__ == "__main__":
    sys.exit(main())
