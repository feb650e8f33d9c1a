"""``txcoord conformance --object-store``: the lakehouse on txcoord's S3 server (versitygw, :mod:`.versitygw`)
with an account per principal, which the ``grant`` case (:mod:`.grant`) needs, and the storage-fault proxy
(:mod:`.faults`) in front of it, which the cases of hostile storage (:mod:`.storage_faults`) need.

The kit, its checker and every other case reach the bucket as its owner (the server's root account), straight;
the ``grant`` case's clients as group A's own account, which the bucket policy ``txcoord grants`` makes
(:func:`coordinator.ops.tenancy.s3_bucket_policy`) allows group A's prefixes only; the fault cases' clients as
the owner through the proxy, which gives a request only the faults a case queues for it.

What it needs beyond txcoord, each named by the error it raises when it is missing: the server built once
(``python -m coordinator.conformance.versitygw build``, with Go) and txcoord's ``conformance`` extra (boto3 and
aiohttp).

Example::

    with ObjectStore(workdir / "s3") as store:
        init_lakehouse(store.lakehouse)
        store.provision(run)    # group A's account, its bucket policy and its TOML (store.granted_config), and the
                                # fault cases' TOML (store.faulty_config; store.proxy queues the faults)
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Optional

from coordinator.conformance import versitygw
from coordinator.conformance.grant import GRANTED
from coordinator.conformance.primitives import Run, write_config
from coordinator.conformance.storage_faults import FAULT_STORAGE, SLOW_REPLY_S
from coordinator.exceptions import ConformanceKitError
from coordinator.lakehouse import Lakehouse, create_group_tables

__all__ = ["ObjectStore"]

BUCKET = "conformance"
ROOT = f"s3://{BUCKET}/lh"
_ACCOUNT = ("svc-conformance-a", "svc-conformance-a-secret")
_EXTRA = "install txcoord's conformance extra: pip install 'txcoord[conformance]'"


class ObjectStore:
    """The S3 server with accounts, a bucket, the lakehouse on it as the owner sees it, and the fault proxy in front
    of it (``with``: started, then stopped). :class:`ConformanceKitError` naming what to install or run when the
    server is not built or the conformance extra is missing, before anything starts."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.server: Optional[versitygw.S3Server] = None
        #: The storage-fault proxy (:class:`~coordinator.conformance.faults.FaultProxyProcess`).
        self.proxy: Optional[Any] = None
        self.lakehouse: Optional[Lakehouse] = None
        self.granted_config: Optional[Path] = None
        self.faulty_config: Optional[Path] = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "ObjectStore":
        if not versitygw.BINARY.exists():
            raise ConformanceKitError(f"--object-store runs txcoord's S3 server (versitygw), which is not built at "
                                      f"{versitygw.BINARY}: run `{versitygw.BUILD_COMMAND}` once (it needs Go, "
                                      f"https://go.dev/dl/; about a minute and a half)")
        try:
            import boto3  # noqa: F401 - its bucket policy is set once the server runs: missing, say so first
            from coordinator.conformance.faults import FaultProxyProcess
        except ImportError as missing:
            raise ConformanceKitError(f"--object-store sets a bucket policy with boto3 and runs a storage-fault proxy "
                                      f"with aiohttp ({missing}): {_EXTRA}") from None
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            self.server = stack.enter_context(versitygw.S3Server(
                self.directory / "data", log_file=str(self.directory / "server.log"), with_accounts=True))
            self.server.create_bucket(BUCKET)
            self.proxy = stack.enter_context(FaultProxyProcess(self.server.endpoint, delay_s=SLOW_REPLY_S,
                                                               log_path=str(self.directory / "proxy.log")))
            self._stack = stack.pop_all()
        self.lakehouse = Lakehouse(ROOT, self.server.storage_options)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def provision(self, run: Run) -> None:
        """Group A's tables and account, the bucket policy that grants it its prefixes, and its TOML; the fault
        cases' TOML."""
        from coordinator.ops.tenancy import s3_bucket_policy

        create_group_tables(self.lakehouse, GRANTED)
        storage = self.server.create_account(*_ACCOUNT)
        # versitygw refuses a policy naming s3:if-none-match (docs/known-limits.md): the rest of it.
        policy = s3_bucket_policy(ROOT, {f"group {GRANTED}": [_ACCOUNT[0]]}, refuse_overwrites=False)
        self._put_bucket_policy(policy)
        self.granted_config = write_config(run.workdir / "grant_a.toml", self.lakehouse, storage=storage)
        self.faulty_config = write_config(run.workdir / "faulty.toml", self.lakehouse,
                                          storage=self.proxy.storage_options(self.server.storage_options) | FAULT_STORAGE)

    def _put_bucket_policy(self, policy: dict) -> None:
        import boto3

        root = self.server.storage_options
        boto3.client("s3", endpoint_url=self.server.endpoint, region_name=root["aws_region"],
                     aws_access_key_id=root["aws_access_key_id"], aws_secret_access_key=root["aws_secret_access_key"],
                     ).put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(policy))
