"""Looking after a lakehouse: ``txcoord maintain``, ``add-group``, ``grants``, ``upgrade`` and ``alert-rules``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional

from coordinator.cli import output
from coordinator.cli.options import EXIT_FAILED, EXIT_OK, at_least, common_options
from coordinator.config import EXIT_USAGE, CoordinatorConfig
from coordinator.exceptions import ConfigError, InvalidArgumentError
from coordinator.lakehouse import Lakehouse

__all__ = ["CONSUMER_ACCOUNT_PREFIX", "grant_options", "print_grants_of", "register", "run_add_group", "run_alert_rules",
           "run_grants", "run_maintain", "run_upgrade"]

#: How ``--account`` names a consumer group's principal: ``consumer:GROUP=ACCOUNT`` (a bare name is a producer
#: group's; ``:`` is in no group's name).
CONSUMER_ACCOUNT_PREFIX = "consumer:"


def register(commands) -> None:
    """``maintain``, ``add-group``, ``grants``, ``upgrade`` and ``alert-rules``, on ``commands`` (the ``txcoord``
    parser's sub-parsers)."""
    _add_maintain(commands)
    _add_add_group(commands)
    _add_grants(commands)
    _add_upgrade(commands)
    _add_alert_rules(commands)


def _add_maintain(commands) -> None:
    maintain = commands.add_parser("maintain", help="compact, checkpoint and vacuum the lakehouse's tables (no JVM)")
    maintain.add_argument("--retention-hours", type=_retention, default=None,
                          help="keep files removed less than this long ago (default: Delta's 168)")
    maintain.add_argument("--log-retention-hours", type=_log_retention, default=None, metavar="H",
                          help="set each table's delta.logRetentionDuration to H hours (fractions allowed), so log "
                               "cleanup keeps the Delta logs bounded (default: leave each table's own, Delta's 30 days)")
    maintain.add_argument("--table", action="append", dest="tables", metavar="NAME",
                          help="only this table, e.g. groups/<group>/commit_log or topics/ORDER_TOPIC (repeatable; default: all)")
    common_options(maintain)
    maintain.set_defaults(run=run_maintain)


def run_maintain(args: argparse.Namespace) -> int:
    """Maintain every table (:mod:`coordinator.ops.maintenance`), with a progress bar; print what each step did.

    Example::

        $ txcoord maintain --config conf/coordinator.toml --retention-hours 24 --log-retention-hours 2
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from coordinator.lakehouse import require_lakehouse
    from coordinator.ops.maintenance import DEFAULT_RETENTION_HOURS, maintain, maintained_tables

    lakehouse = require_lakehouse(Lakehouse.of(CoordinatorConfig.load(args.config)))
    tables = args.tables or maintained_tables(lakehouse)
    retention = DEFAULT_RETENTION_HOURS if args.retention_hours is None else args.retention_hours
    columns = (TextColumn("maintaining"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    # On stderr, so that stdout holds only the result (and --json output stays one JSON document).
    with Progress(*columns, console=output.console(stderr=True), transient=True) as progress:
        task = progress.add_task(tables[0], total=len(tables))
        position = iter(tables[1:])
        results = maintain(lakehouse, tables=tables, retention_hours=retention, log_retention_hours=args.log_retention_hours,
                           on_table=lambda done: progress.update(task, advance=1, description=next(position, "")))
    if args.json:
        output.print_json({"lakehouse": lakehouse.root, "retention_hours": retention,
                     "log_retention_hours": args.log_retention_hours,
                     "tables": [dataclasses.asdict(result) for result in results]})
    else:
        output.print_maintenance(results, retention, args.log_retention_hours)
    failed = [result for result in results if result.failed]
    for result in failed:
        print(f"txcoord maintain: {result.table} could not be maintained: {result.failed}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def _retention(text: str) -> int:
    from coordinator.ops.maintenance import MIN_RETENTION_HOURS

    return at_least(MIN_RETENTION_HOURS, text, "a shorter vacuum deletes files that writers commit while it runs")


def _log_retention(text: str) -> float:
    from coordinator.ops.maintenance import log_retention_interval

    try:
        hours = float(text)
        log_retention_interval(hours)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a positive number of hours: {text!r}") from None
    return hours


def _add_add_group(commands) -> None:
    add_group = commands.add_parser("add-group", help="create what a producer group needs (a running checker takes it "
                                                      "in) and print the grants to give its principal")
    add_group.add_argument("group", metavar="GROUP")
    grant_options(add_group)
    common_options(add_group)
    add_group.set_defaults(run=run_add_group)


def run_add_group(args: argparse.Namespace) -> int:
    """Create a producer group's tables (:func:`coordinator.ops.tenancy.add_group`) and print its grants.

    Example::

        $ txcoord add-group payment_group --config conf/coordinator.toml --account payment_group=svc-payments
    """
    from coordinator.ops.tenancy import add_group, group_principal

    config = CoordinatorConfig.load(args.config)
    try:
        created = add_group(config, args.group)
    except InvalidArgumentError as error:
        print(f"txcoord add-group: {error}", file=sys.stderr)
        return EXIT_USAGE
    return print_grants_of(args, config, {group_principal(args.group)}, created)


def _add_grants(commands) -> None:
    grants = commands.add_parser("grants", help="print what each principal (checker, operators, analysts, every "
                                                "producer and consumer group) may read and write")
    grant_options(grants)
    common_options(grants)
    grants.set_defaults(run=run_grants)


def run_grants(args: argparse.Namespace) -> int:
    """Print every principal's grants (:func:`coordinator.ops.tenancy.access_plan`), and with ``--account``
    on an S3 lakehouse, the bucket policy that gives them.

    Example::

        $ txcoord grants --config conf/coordinator.toml --account checker=svc-checker --account operators=alice
    """
    return print_grants_of(args, CoordinatorConfig.load(args.config), None, [])


def print_grants_of(args: argparse.Namespace, config: CoordinatorConfig, only: Optional[set[str]],
                    created: list[str], described: Optional[dict] = None) -> int:
    """Print the grants of the principals in ``only`` (``None``: every one) and, with ``--account``, the bucket
    policy giving them; ``described`` (JSON-ready) leads ``--json``'s object. The exit status.

    Example::

        print_grants_of(args, config, {consumer_principal("credits")}, [])
    """
    from coordinator.commit_logs import CommitLogs
    from coordinator.ops.consumer_groups import consumer_group_grants
    from coordinator.ops.tenancy import access_plan, merged_policy, s3_bucket_policy

    lakehouse = Lakehouse.of(config)
    consumer_grants, refused = consumer_group_grants(lakehouse)
    for reason in refused:  # one unreadable grant does not hide the others' grants
        print(f"txcoord {args.command}: left out: {reason}", file=sys.stderr)
    consumer_groups = {grant.group: grant.topics for grant in consumer_grants}
    everyone = access_plan(CommitLogs(lakehouse).groups(), consumer_groups)
    plan = [grant for grant in everyone if only is None or grant.principal in only]
    accounts = _accounts(args.account, {grant.principal for grant in everyone})
    try:
        policy = (s3_bucket_policy(lakehouse.root, accounts, refuse_overwrites=not args.allow_overwrites,
                                   consumer_groups=consumer_groups)
                  if accounts and not lakehouse.is_local else None)
    except InvalidArgumentError as error:
        print(f"txcoord {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.merge_into and policy is None:
        print(f"txcoord {args.command}: --merge-into merges the policy --account makes for a lakehouse on S3",
              file=sys.stderr)
        return EXIT_USAGE
    if args.merge_into:
        try:
            policy = merged_policy(json.loads(Path(args.merge_into).read_text()), policy)
        except (OSError, ValueError, AttributeError) as error:
            print(f"txcoord {args.command}: --merge-into {args.merge_into}: not a bucket policy's JSON: {error}",
                  file=sys.stderr)
            return EXIT_USAGE
    if accounts and lakehouse.is_local:
        print(f"txcoord {args.command}: --account makes an S3 bucket policy; {lakehouse.root} is a local directory "
              "(see docs/operations.md#tenancy for its permissions)", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        output.print_json({**(described or {}), "lakehouse": lakehouse.root, "created": created,
                           "grants": [dataclasses.asdict(grant) for grant in plan], "s3_bucket_policy": policy})
    else:
        output.print_grants(lakehouse.root, plan, created, policy)
    return EXIT_OK


def _accounts(pairs: Optional[list[str]], known: set[str]) -> dict[str, list[str]]:
    """``--account``'s PRINCIPAL=ACCOUNT pairs by principal of the plan; :class:`ConfigError` for a malformed pair
    or a principal the lakehouse does not have (its policy would grant that account nothing)."""
    from coordinator.ops.tenancy import ANALYSTS, CHECKER, OPERATORS, consumer_principal, group_principal

    accounts: dict[str, list[str]] = {}
    for pair in pairs or ():
        principal, _, account = pair.partition("=")
        if not account or not principal:
            raise ConfigError(f"--account takes PRINCIPAL=ACCOUNT, got {pair!r}")
        if principal.startswith(CONSUMER_ACCOUNT_PREFIX):
            principal = consumer_principal(principal.removeprefix(CONSUMER_ACCOUNT_PREFIX))
        elif principal not in (CHECKER, OPERATORS, ANALYSTS):
            principal = group_principal(principal)
        if principal not in known:
            kind, _, name = principal.partition(" ")
            raise ConfigError(f"--account {pair}: the lakehouse has no {principal!r}: " + (
                f"`txcoord add-consumer-group {name} --topics ...` adds it" if kind == "consumer" else
                f"`txcoord add-group {name}` adds it" if kind == "group" else "no such principal"))
        accounts.setdefault(principal, []).append(account)
    return accounts


def grant_options(command: argparse.ArgumentParser) -> None:
    """``--account``, ``--allow-overwrites`` and ``--merge-into``, on ``command`` (which prints grants)."""
    command.add_argument("--account", action="append", metavar="PRINCIPAL=ACCOUNT",
                         help="for a lakehouse on S3, also print a bucket policy giving ACCOUNT the grants of PRINCIPAL "
                              f"(checker, operators, analysts, a producer group's name, or {CONSUMER_ACCOUNT_PREFIX}"
                              "GROUP for a consumer group; repeatable)")
    command.add_argument("--allow-overwrites", action="store_true",
                         help="with --account: leave out the statements refusing an overwrite of a commit (a PUT "
                              "without If-None-Match), for an S3-compatible server that refuses a policy naming the "
                              "s3:if-none-match condition key (versitygw 1.8: see docs/known-limits.md)")
    command.add_argument("--merge-into", metavar="POLICY_JSON",
                         help="with --account: print the whole bucket policy, this one (the bucket's current policy, "
                              "as `aws s3api get-bucket-policy --query Policy --output text` prints it) with the "
                              "statements of the principals given put in place, every other statement kept")


def _add_upgrade(commands) -> None:
    upgrade = commands.add_parser("upgrade", help="upgrade a lakehouse whose groups share one commit log (checker "
                                                  "stopped; idempotent)")
    common_options(upgrade)
    upgrade.set_defaults(run=run_upgrade)


def run_upgrade(args: argparse.Namespace) -> int:
    """Upgrade a lakehouse made when every group shared one commit log (:func:`coordinator.ops.tenancy.upgrade`).

    Example::

        $ txcoord upgrade --config conf/coordinator.toml
    """
    from coordinator.checker import CHECKER_NAME
    from coordinator.exceptions import CheckerAlreadyRunningError
    from coordinator.ops.tenancy import upgrade

    config = CoordinatorConfig.load(args.config)
    try:
        done = upgrade(config, CHECKER_NAME)
    except CheckerAlreadyRunningError as error:
        print(f"txcoord upgrade: stop the checker first: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        output.print_json(dataclasses.asdict(done))
    elif not done.done:
        print(f"{config.lakehouse}: nothing to upgrade (each producer group has its own commit log)")
    else:
        print(f"{config.lakehouse} upgraded: system/commit_log is retired after version {done.shared_log_end - 1} "
              f"(what was written to it before is taken in; later records are refused); tables created for "
              f"{len(done.groups)} group(s): {', '.join(done.groups) or 'none'}. Upgrade the producers, grant each "
              "group its prefix (`txcoord grants`), revoke writes to system/commit_log, then start the checker.")
    return EXIT_OK


def _add_alert_rules(commands) -> None:
    rules = commands.add_parser("alert-rules", help="print the Prometheus alert rules for the checker's metrics "
                                                    "(a rule file for Prometheus's rule_files)")
    rules.set_defaults(run=run_alert_rules)


def run_alert_rules(args: argparse.Namespace) -> int:
    """Print the alert rules shipped for the checker's Prometheus metrics (``metrics_port``).

    Example::

        $ txcoord alert-rules > /etc/prometheus/txcoord-alerts.yml
    """
    from importlib.resources import files

    print((files("coordinator.resources") / "txcoord-alerts.yml").read_text(), end="")
    return EXIT_OK
