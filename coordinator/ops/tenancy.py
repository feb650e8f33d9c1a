"""Tenancy: what each principal may read and write, adding a producer group, upgrading a lakehouse.

The storage enforces who is who (:mod:`coordinator.commit_logs`): each principal gets the
prefixes :func:`access_plan` lists, with the storage's ordinary permissions (an S3 bucket policy,
:func:`s3_bucket_policy`; IAM or Unity Catalog grants; POSIX owners and modes).

Example::

    add_group(config, "payment_group")        # its tables, while the checker runs
    for grant in access_plan(["payment_group"]):
        print(grant.principal, grant.access, grant.prefix)
    upgrade(config)                            # a lakehouse made before logs per group
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import pyarrow.compute as pc

from coordinator.commit_logs import CommitLogs, Layout
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import CheckerProgress
from coordinator.doorbells import doorbell_key
from coordinator.exceptions import InvalidArgumentError, MessageValidationError, OutdatedLakehouseError
from coordinator.lakehouse import (CONSUMERS_KEY, GROUPS_KEY, OPERATORS_LOG_KEY, SHARED_LOG_KEY, Lakehouse, create_group_tables,
                                   group_key, init_lakehouse, open_table, read_table)
from coordinator.names import validate_name
from coordinator.tables import HALF

__all__ = ["ANALYSTS", "CHECKER", "OPERATORS", "Grant", "Upgrade", "access_plan", "add_group", "consumer_principal",
           "group_principal",
           "merged_policy", "s3_bucket_policy", "statement_id", "upgrade"]

log = logging.getLogger("coordinator.ops")

CHECKER, OPERATORS, ANALYSTS = "checker", "operators", "analysts"


def group_principal(group: str) -> str:
    """How :func:`access_plan` names the principal of producer group ``group``."""
    return f"group {group}"


def consumer_principal(group: str) -> str:
    """How :func:`access_plan` names the principal of consumer group ``group``.

    Example::

        consumer_principal("credits")  # 'consumer credits'
    """
    return f"consumer {group}"


@dataclass(frozen=True)
class Grant:
    """One permission: ``principal`` may ``access`` the keys that begin with ``prefix`` (relative to
    the lakehouse's root; ``*`` stands for one group's directory; ``…/commit_log`` takes in a group's
    further logs, ``commit_log.<n>/``), or, if ``exact``, the one key ``prefix``. ``access`` is a
    subset of ``read`` (get and list), ``write`` (create and replace) and ``delete``."""

    principal: str
    access: tuple[str, ...]
    prefix: str
    exact: bool = False


def access_plan(groups: Iterable[str], consumer_groups: Optional[Mapping[str, Sequence[str]]] = None) -> list[Grant]:
    """Every grant the lakehouse needs, for its checker, operators, analysts and each of ``groups``.

    * the **checker** reads and writes everything (it also runs ``txcoord maintain``);
    * **operators** write their own commit log; read the checker's tables, the topics and every
      group's commit log (``txcoord status``, ``pending``, ``inspect``), never a group's check requests;
    * **analysts** read the topics and the checker's tables (the audit trail);
    * each **group** writes its own commit logs, its instances' announcements and its doorbell
      (:mod:`coordinator.doorbells`), and reads its own check requests: nothing of another group,
      nothing of the checker's;
    * each **consumer group** of ``consumer_groups`` (group -> the topics or patterns its grant names)
      reads those topics and its own prefix ``consumers/<group>/``, and writes there its instances'
      records, share claims, progress and dead letters; never its grant, the operators' actions on it or
      its redrive table, which **operators** write (they read every consumer group's prefix, and write
      its progress for a reset).

    Example::

        [(g.principal, g.prefix) for g in access_plan(["order_group"]) if g.principal.startswith("group")]
    """
    plan = [
        Grant(CHECKER, ("read", "write", "delete"), ""),
        Grant(OPERATORS, ("read", "write"), f"{OPERATORS_LOG_KEY}/"),
        Grant(OPERATORS, ("read",), "system/"),
        Grant(OPERATORS, ("read",), "topics/"),
        Grant(OPERATORS, ("read",), f"{GROUPS_KEY}/*/commit_log"),
        Grant(ANALYSTS, ("read",), "system/"),
        Grant(ANALYSTS, ("read",), "topics/"),
    ]
    for group in sorted(set(groups)):
        directory = f"{GROUPS_KEY}/{group_key(group)}"
        plan += [Grant(group_principal(group), ("read", "write"), f"{directory}/commit_log"),
                 Grant(group_principal(group), ("read", "write", "delete"), f"{directory}/_producers/"),
                 Grant(group_principal(group), ("read",), f"{directory}/check_requests/"),
                 Grant(group_principal(group), ("read", "write"), doorbell_key(group), exact=True)]
    if consumer_groups:
        plan += [Grant(OPERATORS, ("read",), f"{CONSUMERS_KEY}/"),
                 Grant(OPERATORS, ("read", "write"), f"{CONSUMERS_KEY}/*/_grant.json", exact=True),
                 Grant(OPERATORS, ("read", "write", "delete"), f"{CONSUMERS_KEY}/*/progress/"),
                 Grant(OPERATORS, ("read", "write"), f"{CONSUMERS_KEY}/*/operator_actions/"),
                 Grant(OPERATORS, ("read", "write"), f"{CONSUMERS_KEY}/*/redrive/")]
    for group, topics in sorted((consumer_groups or {}).items()):
        directory, principal = f"{CONSUMERS_KEY}/{group_key(group)}", consumer_principal(group)
        plan += [Grant(principal, ("read",), f"topics/{topic}/") for topic in topics]
        plan += [Grant(principal, ("read",), f"{directory}/"),
                 Grant(principal, ("read", "write", "delete"), f"{directory}/_instances/"),
                 Grant(principal, ("read", "write", "delete"), f"{directory}/shares/"),
                 Grant(principal, ("read", "write"), f"{directory}/progress/"),
                 Grant(principal, ("read", "write"), f"{directory}/dead_letters/")]
    return plan


def s3_bucket_policy(root: str, accounts: Mapping[str, Sequence[str]], refuse_overwrites: bool = True,
                     consumer_groups: Optional[Mapping[str, Sequence[str]]] = None) -> dict:
    """An S3 bucket policy granting :func:`access_plan` on the lakehouse at ``root``
    (``s3://bucket/prefix``) to the accounts of each principal: ``accounts`` maps a principal of the
    plan (``checker``, ``operators``, ``analysts``, ``group <name>``) to its account names or ARNs.
    A principal left out is granted nothing.

    A principal that writes a commit log (each group, the operators) is also refused, with
    ``refuse_overwrites``, any ``PutObject`` of a commit (``_delta_log/*.json``) without ``If-None-Match``:
    a commit can be created, never replaced, so what the checker read stays what the log holds.
    Every writer of a commit sends the header (:class:`~coordinator.appender.DeltaAppender`, delta-rs);
    checkpoints and ``_last_checkpoint``, replaced on purpose, are not ``.json``. AWS S3 evaluates the
    ``s3:if-none-match`` key; a server that does not know it may refuse the whole policy (versitygw
    does: docs/known-limits.md), hence ``refuse_overwrites=False``.

    Each principal gets one statement per set of actions and one listing statement, each with an id
    naming the principal (:func:`statement_id`), so that :func:`merged_policy` can put a new group's into
    a bucket's policy in place. S3 caps a bucket policy at 20 KB: how many groups fit is measured in
    docs/operations.md#tenancy; beyond, attach each principal's statements to its own IAM identity.

    Example::

        s3_bucket_policy("s3://lakehouse/lh", {"checker": ["svc-checker"], "group order_group": ["svc-orders"]})
    """
    if not root.startswith("s3://"):
        raise InvalidArgumentError(f"a bucket policy is for a lakehouse on S3, not {root}")
    bucket, _, prefix = root.removeprefix("s3://").partition("/")
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    groups = [principal.removeprefix("group ") for principal in accounts if principal.startswith("group ")]
    for group, topics in sorted((consumer_groups or {}).items()):
        if accounts.get(consumer_principal(group)) and any(c in topic for topic in topics for c in "[]"):
            raise InvalidArgumentError(f"consumer group {group!r}'s grant names {', '.join(topics)}: a bucket policy "
                                       "matches keys with * and ? only, no [...]; grant it its topics by name or with "
                                       "* and ? (`txcoord add-consumer-group`)")
    plan = access_plan(groups, consumer_groups)
    statements = []
    for principal in dict.fromkeys(grant.principal for grant in plan):
        names = list(accounts.get(principal, ()))
        if not names:
            continue
        grants = [grant for grant in plan if grant.principal == principal]
        by_actions: dict[tuple[str, ...], list[str]] = {}
        for grant in grants:
            actions = tuple(action for access, action in _S3_ACTIONS if access in grant.access)
            by_actions.setdefault(actions, []).append(f"arn:aws:s3:::{bucket}/{base}{grant.prefix}{'' if grant.exact else '*'}")
        own = [{"Effect": "Allow", "Principal": {"AWS": names}, "Action": list(actions), "Resource": resources}
               for actions, resources in by_actions.items()]
        listed = [f"{base}{grant.prefix}*" for grant in grants if not grant.exact]
        if any(grant.prefix.startswith(f"{GROUPS_KEY}/*/") for grant in grants):  # finding the groups lists their parent
            listed.append(f"{base}{GROUPS_KEY}/")
        if any(grant.prefix.startswith(f"{CONSUMERS_KEY}/*/") for grant in grants):
            listed.append(f"{base}{CONSUMERS_KEY}/")
        own.append({"Effect": "Allow", "Principal": {"AWS": names}, "Action": ["s3:ListBucket"],
                    "Resource": [f"arn:aws:s3:::{bucket}"], "Condition": {"StringLike": {"s3:prefix": listed}}})
        logs = [grant.prefix.rstrip("/") for grant in grants if "write" in grant.access
                and grant.prefix.rstrip("/").endswith("commit_log")]
        if refuse_overwrites and logs:
            own.append({"Effect": "Deny", "Principal": {"AWS": names}, "Action": ["s3:PutObject"],
                        "Resource": [f"arn:aws:s3:::{bucket}/{base}{log}*/_delta_log/*.json" for log in logs],
                        "Condition": {"Null": {"s3:if-none-match": "true"}}})
        statements += [{"Sid": statement_id(principal, number), **statement} for number, statement in enumerate(own, 1)]
    return {"Version": "2012-10-17", "Statement": statements}


def statement_id(principal: str, number: int) -> str:
    """The id of a principal's ``number``-th statement in :func:`s3_bucket_policy`: letters and digits only, as
    policies require, and one principal's never a prefix of another's (a group's name is spelled in hex).

    Example::

        statement_id("group order_group", 1)   # 'TxcoordGroup6f726465725f67726f7570S1'
    """
    if principal.startswith("group "):
        return f"TxcoordGroup{principal.removeprefix('group ').encode().hex()}S{number}"
    if principal.startswith("consumer "):
        return f"TxcoordConsumer{principal.removeprefix('consumer ').encode().hex()}S{number}"
    return f"Txcoord{principal.capitalize()}S{number}"


def merged_policy(current: Mapping, new: Mapping) -> dict:
    """``current`` (a bucket's policy, as ``aws s3api get-bucket-policy`` gives it) with ``new``'s statements in
    place: those of the same principals replaced, every other statement kept as it was.

    Example::

        merged_policy(json.load(open("current.json")), s3_bucket_policy(root, {"group g": ["svc-g"]}))
    """
    replaced = {_principal_of(statement.get("Sid", "")) for statement in new.get("Statement", [])} - {None}
    kept = [statement for statement in current.get("Statement", [])
            if _principal_of(statement.get("Sid", "")) not in replaced]
    return {"Version": current.get("Version", "2012-10-17"), "Statement": [*kept, *new.get("Statement", [])]}


def _principal_of(sid: str) -> Optional[str]:
    """The part of a :func:`statement_id` before its number; ``None`` for a statement not txcoord's."""
    head, separator, number = sid.rpartition("S")
    return head if sid.startswith("Txcoord") and separator and number.isdigit() else None


_S3_ACTIONS = (("read", "s3:GetObject"), ("write", "s3:PutObject"), ("delete", "s3:DeleteObject"))


def add_group(config: CoordinatorConfig, group: str) -> list[str]:
    """Create what producer group ``group`` needs (its commit log and check-request table) and return
    the paths created. A running checker takes the group's records in from its next trigger.

    Example::

        add_group(config, "payment_group")  # ['/…/groups/payment_group/commit_log', '/…/check_requests']
    """
    try:
        validate_name("producer group", group)
    except MessageValidationError as error:
        raise InvalidArgumentError(str(error)) from None
    lakehouse = Lakehouse.of(config)
    CommitLogs(lakehouse).layout()
    init_lakehouse(lakehouse)
    return create_group_tables(lakehouse, group)


@dataclass(frozen=True)
class Upgrade:
    """What :func:`upgrade` did."""

    done: bool  # False: the lakehouse had nothing to upgrade
    shared_log_end: Optional[int] = None  # versions of the shared log trusted (those written before the upgrade)
    groups: list[str] = field(default_factory=list)  # the groups found in the shared log, whose tables it created
    first_batch_id: Optional[int] = None  # of the checker's new epoch


def upgrade(config: CoordinatorConfig, app_id: str) -> Upgrade:
    """Upgrade a lakehouse made when every producer group shared one commit log (``system/commit_log``).

    With no checker running (it takes the checker's lease; :class:`CheckerAlreadyRunningError`
    otherwise): records how far the shared log goes (what was written there so far is taken in as
    before; what arrives afterwards is refused, with the reason), creates the operators' log and a
    commit log and check-request table for every group found, replays the checker's last batch and
    starts its new epoch (the old checkpoint is set aside). Nothing is lost or taken twice.
    Idempotent: run again, it finishes what a crash interrupted, or does nothing.

    Example::

        upgrade(config, "txcoord-checker").shared_log_end  # e.g. 5312
    """
    from coordinator.checker.epochs import begin_next_epoch

    lakehouse = Lakehouse.of(config)
    logs = CommitLogs(lakehouse)
    shared = lakehouse.key_path(SHARED_LOG_KEY)
    if not lakehouse.exists(SHARED_LOG_KEY):
        return Upgrade(done=False)
    lease = CheckerLease(lakehouse, ttl_s=config.checker_lease_ttl_ms / 1000).acquire()
    try:
        try:
            layout = logs.layout()
        except OutdatedLakehouseError:  # no layout record yet: this run retires the shared log
            layout = Layout(shared_log_end=open_table(shared, storage=lakehouse.storage).version() + 1)
            logs.record_layout(layout)
        init_lakehouse(lakehouse)
        groups = _groups_of(lakehouse, shared)
        for group in groups:
            create_group_tables(lakehouse, group)
        store = CheckerProgress(lakehouse)
        progress = store.load()
        if progress is None or not progress.epoch.shared_log:
            return Upgrade(done=True, shared_log_end=layout.shared_log_end, groups=groups,
                           first_batch_id=None if progress is None else progress.epoch.first_batch_id)
        following = begin_next_epoch(config, store, progress, app_id)
        log.warning("lakehouse %s upgraded: %s trusted up to version %d; %d group(s)", lakehouse.root, SHARED_LOG_KEY,
                    layout.shared_log_end - 1, len(groups))
        return Upgrade(done=True, shared_log_end=layout.shared_log_end, groups=groups,
                       first_batch_id=following.epoch.first_batch_id)
    finally:
        lease.release()


def _groups_of(lakehouse: Lakehouse, shared: str) -> list[str]:
    """The producer groups that wrote to the shared log, or have halves in the half queue."""
    names = set(read_table(shared, ["producer_group"], storage=lakehouse.storage).column(0).unique().to_pylist())
    names |= set(pc.unique(lakehouse.read(HALF, ["producer_group"]).column(0)).to_pylist())
    return sorted(name for name in names if name and name.strip())
