"""``txcoord conformance --object-store``: the lakehouse on txcoord's S3 server (versitygw, started by the
checkout's ``scripts/s3_server.py``) with an account per principal, which the ``grant`` case (:mod:`.grant`) needs.

The kit, its checker and every other case reach the bucket as its owner (the server's root account); the
``grant`` case's clients as group A's own account, which the bucket policy ``txcoord grants`` makes
(:func:`coordinator.ops.tenancy.s3_bucket_policy`) allows group A's prefixes only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from coordinator.conformance.grant import GRANTED
from coordinator.conformance.primitives import Run, write_config
from coordinator.exceptions import ConformanceKitError
from coordinator.lakehouse import Lakehouse, create_group_tables

__all__ = ["S3Accounts"]

BUCKET = "conformance"
ROOT = f"s3://{BUCKET}/lh"
_ACCOUNT = ("svc-conformance-a", "svc-conformance-a-secret")


def _s3_server_module():
    """``scripts.s3_server`` of the checkout this package is installed from (editable), or why not."""
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "scripts" / "s3_server.py").exists():
        raise ConformanceKitError("--object-store needs a checkout of txcoord (its scripts/s3_server.py), with "
                                  "txcoord installed from it (make setup)")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from scripts import s3_server

    if not s3_server.BINARY.exists():
        raise ConformanceKitError(f"the S3 server is not built ({s3_server.BINARY}): run `make s3-server` first")
    return s3_server


class S3Accounts:
    """The S3 server with accounts, a bucket, and the lakehouse on it as the owner sees it (``with``: started,
    then stopped)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.server = None
        self.lakehouse: Optional[Lakehouse] = None
        self.granted_config: Optional[Path] = None

    def __enter__(self) -> "S3Accounts":
        s3_server = _s3_server_module()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.server = s3_server.S3Server(self.directory / "data", log_file=str(self.directory / "server.log"),
                                         with_accounts=True).start()
        self.server.create_bucket(BUCKET)
        self.lakehouse = Lakehouse(ROOT, self.server.storage_options)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.stop()

    def provision(self, run: Run) -> None:
        """Group A's tables and account, the bucket policy that grants it its prefixes, and its TOML."""
        from coordinator.ops.tenancy import s3_bucket_policy

        create_group_tables(self.lakehouse, GRANTED)
        storage = self.server.create_account(*_ACCOUNT)
        # versitygw refuses a policy naming s3:if-none-match (docs/known-limits.md): the rest of it.
        policy = s3_bucket_policy(ROOT, {f"group {GRANTED}": [_ACCOUNT[0]]}, refuse_overwrites=False)
        self._put_bucket_policy(policy)
        self.granted_config = write_config(run.workdir / "grant_a.toml", self.lakehouse, storage=storage)

    def _put_bucket_policy(self, policy: dict) -> None:
        try:
            import boto3
        except ImportError:
            raise ConformanceKitError("--object-store sets a bucket policy with boto3: install txcoord's dev extra "
                                      "(make setup)") from None
        root = self.server.storage_options
        boto3.client("s3", endpoint_url=self.server.endpoint, region_name=root["aws_region"],
                     aws_access_key_id=root["aws_access_key_id"], aws_secret_access_key=root["aws_secret_access_key"],
                     ).put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(policy))

