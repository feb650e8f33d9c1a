"""``txcoord conformance --object-store``: the lakehouse on txcoord's S3 server (versitygw, :mod:`.versitygw`)
with an account per principal, which the ``grant`` case (:mod:`.grant`) needs.

The kit, its checker and every other case reach the bucket as its owner (the server's root account); the
``grant`` case's clients as group A's own account, which the bucket policy ``txcoord grants`` makes
(:func:`coordinator.ops.tenancy.s3_bucket_policy`) allows group A's prefixes only.

What it needs beyond txcoord, each named by the error it raises when it is missing: the server built once
(``python -m coordinator.conformance.versitygw build``, with Go) and txcoord's ``conformance`` extra (boto3).

Example::

    with ObjectStore(workdir / "s3") as store:
        init_lakehouse(store.lakehouse)
        store.provision(run)        # group A's account, its bucket policy and its TOML (store.granted_config)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from coordinator.conformance import versitygw
from coordinator.conformance.grant import GRANTED
from coordinator.conformance.primitives import Run, write_config
from coordinator.exceptions import ConformanceKitError
from coordinator.lakehouse import Lakehouse, create_group_tables

__all__ = ["ObjectStore"]

BUCKET = "conformance"
ROOT = f"s3://{BUCKET}/lh"
_ACCOUNT = ("svc-conformance-a", "svc-conformance-a-secret")
_EXTRA = "install txcoord's conformance extra: pip install 'txcoord[conformance]'"


class ObjectStore:
    """The S3 server with accounts, a bucket, and the lakehouse on it as the owner sees it (``with``: started,
    then stopped). :class:`ConformanceKitError` naming what to install or run when the server is not built or
    boto3 is missing, before anything starts."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.server: Optional[versitygw.S3Server] = None
        self.lakehouse: Optional[Lakehouse] = None
        self.granted_config: Optional[Path] = None

    def __enter__(self) -> "ObjectStore":
        if not versitygw.BINARY.exists():
            raise ConformanceKitError(f"--object-store runs txcoord's S3 server (versitygw), which is not built at "
                                      f"{versitygw.BINARY}: run `{versitygw.BUILD_COMMAND}` once (it needs Go, "
                                      f"https://go.dev/dl/; about a minute and a half)")
        try:
            import boto3  # noqa: F401 - its bucket policy is set once the server runs: missing, say so first
        except ImportError:
            raise ConformanceKitError(f"--object-store sets a bucket policy with boto3: {_EXTRA}") from None
        self.directory.mkdir(parents=True, exist_ok=True)
        self.server = versitygw.S3Server(self.directory / "data", log_file=str(self.directory / "server.log"),
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
        import boto3

        root = self.server.storage_options
        boto3.client("s3", endpoint_url=self.server.endpoint, region_name=root["aws_region"],
                     aws_access_key_id=root["aws_access_key_id"], aws_secret_access_key=root["aws_secret_access_key"],
                     ).put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(policy))
