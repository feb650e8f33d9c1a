"""``txcoord conformance --object-store``: the lakehouse on txcoord's S3 server (versitygw, started by the
checkout's ``scripts/s3_server.py``) with an account per principal, and the ``grant`` case, which only
accounts can make: a client started as one group with another group's credentials is refused by the storage.

The kit, its checker and every other case reach the bucket as its owner (the server's root account); the
``grant`` case's clients as group A's own account, which the bucket policy ``txcoord grants`` makes
(:func:`coordinator.ops.tenancy.s3_bucket_policy`) allows group A's prefixes only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Optional

from coordinator.conformance.client import ClientProcess, Deadline, message
from coordinator.conformance.kit import Run, write_config
from coordinator.exceptions import ConformanceKitError
from coordinator.lakehouse import Lakehouse, create_group_tables

__all__ = ["GRANTED", "S3Accounts", "STRANGER", "case_grant"]

BUCKET = "conformance"
ROOT = f"s3://{BUCKET}/lh"
#: The group whose account the grant case uses, and the group it claims to be with it.
GRANTED, STRANGER = "conformance_grant_a", "conformance_grant_b"
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


def case_grant(run: Run, deadline: Deadline, new_client: Callable[[], ClientProcess]) -> None:
    """Group A's account cannot write as group B (refused by the storage: nothing of B stored); as group A it can."""
    from coordinator.conformance.cases import COMMIT, TOPIC, expect, expect_delivered

    config = run.object_store.granted_config
    stranger = new_client()
    reply = stranger.request({"op": "start", "config": str(config), "group": STRANGER})
    if reply.get("ok"):
        reply = stranger.request(stranger.send_op([message(TOPIC, b"conformance: outside the grant")], COMMIT))
    expect(reply.get("ok") is False and reply.get("error") in ("AccessDeniedError", "HalfNotStoredError")
           and reply.get("retriable") is not True,
           f"group A's account writing as group B: the client replied {reply}; expected AccessDeniedError "
           "(or HalfNotStoredError, not retriable) at start or at the send")
    halves = run.observed.halves(STRANGER)
    expect(not halves, f"system/half holds {len(halves)} half(s) of group B, written with group A's account")
    expect(not run.observed.log_records(STRANGER), "group B's commit log holds records written with group A's account")
    granted = new_client()
    granted.start(config, GRANTED)
    messages = [message(TOPIC, b"conformance: inside the grant")]
    expect_delivered(run, deadline, granted.send(messages, COMMIT), messages)
    granted.stop()
