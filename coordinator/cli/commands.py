"""The ``txcoord`` commands (also ``python -m coordinator``): arguments in, exit code out;
what they print is :mod:`coordinator.cli.output`'s.

Subcommands (each reads ``--config``, default ``conf/coordinator.toml``)::

    txcoord init                      # create the lakehouse's system tables (and the config file, if missing)
    txcoord checker [--exit-if-running] [--recover-checkpoint]   # run the checker (needs txcoord[spark])
    txcoord spark-setup [--properties-file | --conf-dir | --job-file JOB] [--no-class-archive]   # Spark's jars and class archive; what spark-submit needs
    txcoord status                    # pending, checks, discards, rejections, the checker and its lag
    txcoord pending [--older-than DURATION] [--group G]   # hanging transactions and what comes next
    txcoord resolve TRANSACTION_ID --commit|--rollback --reason TEXT   # end a hanging transaction by hand
    txcoord inspect TRANSACTION_ID    # one transaction's timeline, from every table
    txcoord maintain [--retention-hours H] [--log-retention-hours H] [--table NAME]   # compact, checkpoint, vacuum
    txcoord demo [--lakehouse DIR] [--orders N] [--object-store S3_URL]   # the order/credits story, end to end
    txcoord alert-rules               # the Prometheus alert rules for the checker's metrics (no --config)
    txcoord console [--port N] [--host H] [--users FILE]   # the operators' web console (needs txcoord[console])
    txcoord console-user add|remove|list [NAME] [--role viewer|operator]   # who may sign in to it

``init``, ``status``, ``pending``, ``resolve``, ``inspect`` and ``maintain`` start no JVM; ``txcoord --version``
prints the version. Output is for people; ``--json``
prints one JSON document for scripts instead.

Exit codes: 0 success; 1 the answer is bad news (``status``: no live checker;
``inspect``: no table knows the transaction) or the command failed; 2 bad
arguments or configuration, or no lakehouse where the configuration points.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from coordinator.cli import consumers, output
from coordinator.config import EXIT_USAGE, CoordinatorConfig
from coordinator.exceptions import (AccessDeniedError, ConfigError, InvalidArgumentError, LakehouseNotFoundError,
                                    OutdatedLakehouseError, SparkSetupError, StorageUnavailableError)
from coordinator.lakehouse import Lakehouse

EXIT_OK = 0
EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand.

    Example::

        build_parser().parse_args(["demo", "--orders", "12"]).orders  # 12
    """
    from coordinator.demo import story as demo
    from coordinator.demo.services import MIN_ORDERS
    from coordinator.jobs import checker

    parser = argparse.ArgumentParser(prog="txcoord", description="Transactional messages on Delta Lake.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser("init", help="create the lakehouse's system tables, and the config file if missing "
                                            "(idempotent)")
    _common_options(init)
    init.set_defaults(run=run_init)

    run_checker_command = commands.add_parser(
        "checker", help="run the checker until SIGTERM (needs txcoord[spark]; exit 3: another holds the lease, "
                        "4: the checkpoint needs --recover-checkpoint)")
    checker.add_arguments(run_checker_command)
    run_checker_command.set_defaults(run=run_checker, json=False)

    spark_setup = commands.add_parser("spark-setup", help="cache the jars Spark needs (once, then offline) and print "
                                                          "what spark-submit needs to run the jobs")
    shown = spark_setup.add_mutually_exclusive_group()
    shown.add_argument("--properties-file", action="store_true",
                       help="print only the file to pass as spark-submit --properties-file")
    shown.add_argument("--conf-dir", action="store_true",
                       help="print only the empty folder to set as SPARK_CONF_DIR beside --properties-file, "
                            "which lets the driver map its class archive")
    shown.add_argument("--job-file", choices=sorted(_spark_jobs()), metavar="JOB",
                       help=f"print only the script spark-submit runs for JOB ({', '.join(sorted(_spark_jobs()))})")
    spark_setup.add_argument("--no-class-archive", dest="class_archive", action="store_false",
                             help="do not write the driver's class archive (a short run of the checker, once per JDK "
                                  "and Spark, that makes every later start of a job about 3 s faster)")
    spark_setup.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    spark_setup.set_defaults(run=run_spark_setup)

    status = commands.add_parser("status", help="the lakehouse's health; exit 1 if no checker is alive")
    _common_options(status)
    status.set_defaults(run=run_status)

    pending = commands.add_parser("pending", help="hanging transactions: age, checks so far, next check, addressee")
    pending.add_argument("--older-than", type=_duration, default=0.0, metavar="DURATION",
                         help="only transactions at least this old: 90s, 10m, 2h, 1d (default: all)")
    pending.add_argument("--group", default=None, metavar="G", help="only this producer group")
    _common_options(pending)
    pending.set_defaults(run=run_pending)

    resolve = commands.add_parser("resolve", help="end a pending transaction, or commit a discarded one, by hand, through the commit log")
    resolve.add_argument("transaction_id", metavar="TRANSACTION_ID")
    decision = resolve.add_mutually_exclusive_group(required=True)
    decision.add_argument("--commit", dest="decision", action="store_const", const="COMMIT_MESSAGE",
                          help="deliver its messages")
    decision.add_argument("--rollback", dest="decision", action="store_const", const="ROLLBACK_MESSAGE",
                          help="drop its messages")
    resolve.add_argument("--reason", required=True, help="why, for the audit trail (`txcoord inspect` shows it)")
    _common_options(resolve)
    resolve.set_defaults(run=run_resolve)

    inspect = commands.add_parser("inspect", help="one transaction's timeline; exit 1 if no table knows it")
    inspect.add_argument("transaction_id", metavar="TRANSACTION_ID")
    _common_options(inspect)
    inspect.set_defaults(run=run_inspect)

    maintain = commands.add_parser("maintain", help="compact, checkpoint and vacuum the lakehouse's tables (no JVM)")
    maintain.add_argument("--retention-hours", type=_retention, default=None,
                          help="keep files removed less than this long ago (default: Delta's 168)")
    maintain.add_argument("--log-retention-hours", type=_log_retention, default=None, metavar="H",
                          help="set each table's delta.logRetentionDuration to H hours (fractions allowed), so log "
                               "cleanup keeps the Delta logs bounded (default: leave each table's own, Delta's 30 days)")
    maintain.add_argument("--table", action="append", dest="tables", metavar="NAME",
                          help="only this table, e.g. groups/<group>/commit_log or topics/ORDER_TOPIC (repeatable; default: all)")
    _common_options(maintain)
    maintain.set_defaults(run=run_maintain)

    add_group = commands.add_parser("add-group", help="create what a producer group needs (a running checker takes it "
                                                      "in) and print the grants to give its principal")
    add_group.add_argument("group", metavar="GROUP")
    _grant_options(add_group)
    _common_options(add_group)
    add_group.set_defaults(run=run_add_group)

    grants = commands.add_parser("grants", help="print what each principal (checker, operators, analysts, every "
                                                "group) may read and write")
    _grant_options(grants)
    _common_options(grants)
    grants.set_defaults(run=run_grants)

    upgrade = commands.add_parser("upgrade", help="upgrade a lakehouse whose groups share one commit log (checker "
                                                  "stopped; idempotent)")
    _common_options(upgrade)
    upgrade.set_defaults(run=run_upgrade)

    rules = commands.add_parser("alert-rules", help="print the Prometheus alert rules for the checker's metrics "
                                                    "(a rule file for Prometheus's rule_files)")
    rules.set_defaults(run=run_alert_rules)

    web = commands.add_parser("console", help="serve the operators' web console: pending, discarded, timelines, "
                                              "charts, ending a transaction by hand (needs txcoord[console])")
    web.add_argument("--port", type=_port, default=None, help="TCP port (default: 8470; 0: any free port)")
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    web.add_argument("--refresh", type=_refresh, default=5, metavar="SECONDS",
                     help="how often live pages reload themselves (default: %(default)s)")
    _users_option(web)
    web.set_defaults(run=run_console)

    console_user = commands.add_parser("console-user", help="add, remove or list the console's users (needs txcoord[console])")
    console_user.add_argument("action", choices=("add", "remove", "list"))
    console_user.add_argument("name", nargs="?", metavar="NAME")
    console_user.add_argument("--role", choices=("viewer", "operator"), default=None,
                              help="add: a viewer reads; an operator may also end transactions by hand")
    console_user.add_argument("--password-stdin", action="store_true",
                              help="add: read the password from the first line of stdin instead of prompting")
    console_user.add_argument("--storage", action="append", default=[], metavar="KEY=VALUE",
                              help="add: a storage setting of this user's own (e.g. aws_access_key_id=...): the "
                                   "console then reads and writes as them; repeat for each")
    _users_option(console_user)
    console_user.set_defaults(run=run_console_user)

    run = commands.add_parser("demo", help="run the order/credits story against a local lakehouse (or one on S3)")
    run.add_argument("--lakehouse", default=demo.DEFAULT_LAKEHOUSE,
                     help=f"demo directory, wiped and recreated (default: ./{demo.DEFAULT_LAKEHOUSE})")
    run.add_argument("--object-store", metavar="S3_URL",
                     help="keep the tables at this s3://BUCKET/PREFIX instead (it must hold no lakehouse yet; the "
                          "AWS_* environment variables reach it), the directory keeping the config, SQLite and logs")
    run.add_argument("--orders", type=_order_count, default=demo.DEFAULT_ORDERS,
                     help=f"orders to send, at least {MIN_ORDERS} (default: {demo.DEFAULT_ORDERS})")
    run.add_argument("--threads", type=_thread_count, default=demo.DEFAULT_THREADS,
                     help=f"sending threads (default: {demo.DEFAULT_THREADS})")
    run.add_argument("--seed", type=int, default=demo.DEFAULT_SEED, help="seed of the orders' fates (default: %(default)s)")
    run.add_argument("--timeout", type=float, default=demo.DEFAULT_TIMEOUT_S,
                     help="seconds to wait for every order to settle (default: %(default)s)")
    run.add_argument("--json", action="store_true",
                     help="print the outcome as one JSON document (the running commentary goes to stderr)")
    run.set_defaults(run=run_demo)
    consumers.register(commands)
    return parser


def run_init(args: argparse.Namespace) -> int:
    """Create the missing system tables of the configured lakehouse and say which.

    Example::

        $ txcoord init --config conf/coordinator.toml
        created system/commit_log
        ...
        lakehouse /work/lakehouse initialised: 7 table(s) created
    """
    from coordinator.lakehouse import init_lakehouse

    written = _write_missing_config(args.config)
    config = CoordinatorConfig.load(args.config)
    root = Lakehouse.of(config).root
    created = init_lakehouse(Lakehouse.of(config))
    if args.json:
        output.print_json({"lakehouse": root, "created": created, "config_written": written})
        return EXIT_OK
    if written:
        print(f"wrote {written} (every setting at its default, each explained)")
    for name in created:
        print(f"created {name}")
    if created:
        print(f"lakehouse {root} initialised: {len(created)} table(s) created")
    else:
        print(f"lakehouse {root} already initialised")
    return EXIT_OK


def _write_missing_config(path: Optional[str]) -> Optional[str]:
    """Write the commented default configuration to ``path`` if it names a file that does not exist."""
    from importlib.resources import files
    from pathlib import Path

    if path is None or Path(path).exists():
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text((files("coordinator.resources") / "coordinator.toml").read_text())
    return path


def run_checker(args: argparse.Namespace) -> int:
    """Run the checker job (:mod:`coordinator.jobs.checker`) in this process until SIGTERM or SIGINT.

    Example::

        $ txcoord checker --config conf/coordinator.toml
    """
    from coordinator.jobs import checker

    return checker.run(args, "txcoord checker")


def run_alert_rules(args: argparse.Namespace) -> int:
    """Print the alert rules shipped for the checker's Prometheus metrics (``metrics_port``).

    Example::

        $ txcoord alert-rules > /etc/prometheus/txcoord-alerts.yml
    """
    from importlib.resources import files

    print((files("coordinator.resources") / "txcoord-alerts.yml").read_text(), end="")
    return EXIT_OK


def run_console(args: argparse.Namespace) -> int:
    """Serve the web console (:mod:`coordinator.web`) until interrupted; exit 2 if it has no user.

    Example::

        $ txcoord console --config conf/coordinator.toml --port 8470
    """
    import logging

    web = _console_extra()
    config = CoordinatorConfig.load(args.config)
    Lakehouse.of(config)  # a bad location fails now, not at the first page
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = web.console_server(config, _users_file(args), host=args.host,
                                port=web.DEFAULT_PORT if args.port is None else args.port, refresh_s=args.refresh)
    print(f"txcoord console: {server.url} (users from {_users_file(args)}; Ctrl-C to stop)", flush=True)

    def stop(signum, frame):  # SIGTERM (systemd's stop) ends it as cleanly as Ctrl-C, with status 0
        raise SystemExit(EXIT_OK)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    finally:
        server.close()
    return EXIT_OK


def run_console_user(args: argparse.Namespace) -> int:
    """Add, remove or list the console's users (:mod:`coordinator.web.users`).

    Example::

        $ txcoord console-user add alice --role operator --config conf/coordinator.toml
    """
    import getpass

    web = _console_extra()
    users = web.ConsoleUsers.load(_users_file(args))
    if args.action == "list":
        for name in users.names():
            print(f"{name}\t{users.get(name).role}" + ("\town storage credentials" if users.get(name).storage else ""))
        return EXIT_OK
    if not args.name:
        print(f"txcoord console-user {args.action}: name the user", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.action == "remove":
            users.remove(args.name)
        else:
            if args.role is None:
                print("txcoord console-user add: give the user a --role (viewer or operator)", file=sys.stderr)
                return EXIT_USAGE
            if args.password_stdin:
                password = sys.stdin.readline().rstrip("\n")
            else:
                password = getpass.getpass(f"password for {args.name}: ")
                if getpass.getpass("again: ") != password:
                    print("txcoord console-user add: the passwords differ", file=sys.stderr)
                    return EXIT_USAGE
            users.add(args.name, args.role, password, storage=_settings(args.storage))
    except InvalidArgumentError as error:
        print(f"txcoord console-user {args.action}: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{'removed' if args.action == 'remove' else 'saved'} console user {args.name} in {users.path}")
    return EXIT_OK


def _console_extra():
    try:
        import coordinator.web as web
    except ModuleNotFoundError as error:
        raise ConfigError(f"the console needs its extra ({error.name} is missing): `pip install 'txcoord[console]'`") from None
    return web


def _users_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    command.add_argument("--users", default=None, metavar="FILE",
                         help="the console's users file (default: console-users.toml beside the config file)")


def _users_file(args: argparse.Namespace) -> Path:
    from coordinator.config import DEFAULT_CONFIG_PATH

    return Path(args.users) if args.users else Path(args.config or DEFAULT_CONFIG_PATH).parent / "console-users.toml"


def _settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise InvalidArgumentError(f"a storage setting is KEY=VALUE, got {pair!r}")
        settings[key.strip()] = value
    return settings


def run_spark_setup(args: argparse.Namespace) -> int:
    """Cache the jars Spark needs (with a progress display, the first time), write the driver's class
    archive if missing (:mod:`coordinator.jobs.training`; a failure there is said and skipped) and
    print what ``spark-submit`` takes to run txcoord's jobs from this installation.

    Example::

        $ SPARK_CONF_DIR="$(txcoord spark-setup --conf-dir)" \\
              spark-submit --properties-file "$(txcoord spark-setup --properties-file)" \\
              "$(txcoord spark-setup --job-file checker)" --config conf/coordinator.toml
    """
    from coordinator.spark.class_archive import class_archive, empty_conf_dir
    from coordinator.spark.jars import provided_delta
    from coordinator.spark.session import launch_jars, read_spark_defaults
    from coordinator.spark.submit import job_script, submit_properties

    if args.job_file:
        print(job_script(args.job_file))
        return EXIT_OK
    settings = read_spark_defaults()
    provider = provided_delta(settings)
    if args.properties_file or args.conf_dir:
        properties = submit_properties()
        if properties is None:
            print(f"txcoord spark-setup: Spark already has Delta ({provider}); its own configuration applies",
                  file=sys.stderr)
            return EXIT_FAILED
        print(empty_conf_dir() if args.conf_dir else properties)
        return EXIT_OK
    jars = launch_jars(settings)
    archive = None if provider else class_archive()
    if archive is not None and args.class_archive and not archive.is_file():
        _write_class_archive()
    properties = submit_properties()
    archive = archive if archive is not None and archive.is_file() else None
    conf_dir = empty_conf_dir() if properties is not None else None
    jobs = {name: str(job_script(name)) for name in sorted(_spark_jobs())}
    if args.json:
        output.print_json({"properties_file": str(properties) if properties else None, "jars": jars,
                           "delta_provided_by": provider, "class_archive": str(archive) if archive else None,
                           "spark_conf_dir": str(conf_dir) if conf_dir else None, "jobs": jobs})
    else:
        output.print_spark_setup(properties, jars, provider, archive, conf_dir, jobs)
    return EXIT_OK


def _write_class_archive() -> None:
    from coordinator.jobs.training import write_class_archive

    print("txcoord spark-setup: writing the driver's class archive (once per JDK and Spark: a short run of the "
          "checker, about half a minute)", file=sys.stderr, flush=True)
    try:
        archive = write_class_archive()
    except SparkSetupError as error:
        print(f"txcoord spark-setup: {error}\nThe jobs start without one (about 3 s slower); "
              "`txcoord spark-setup` tries again.", file=sys.stderr)
        return
    print(f"txcoord spark-setup: class archive written ({archive.stat().st_size / 1e6:.0f} MB)", file=sys.stderr)


def run_status(args: argparse.Namespace) -> int:
    """Print the lakehouse's health (:mod:`coordinator.ops.status`); exit 1 when no checker is alive.

    Example::

        $ txcoord status --config demo-lakehouse/demo.toml
        $ txcoord status --json | jq .pending_transactions
    """
    from coordinator.ops.status import read_status

    status = read_status(CoordinatorConfig.load(args.config))
    if args.json:
        output.print_json(status.to_dict())
    else:
        output.print_status(status)
    return EXIT_OK if status.checker_alive else EXIT_FAILED


def run_pending(args: argparse.Namespace) -> int:
    """Print the pending transactions (:mod:`coordinator.ops.pending`), oldest first.

    Example::

        $ txcoord pending --older-than 10m --group order_group --config conf/coordinator.toml
    """
    from coordinator.ops.pending import pending_transactions

    now = datetime.now(timezone.utc)
    transactions = pending_transactions(CoordinatorConfig.load(args.config), older_than_s=args.older_than,
                                        group=args.group, now=now)
    if args.json:
        output.print_json({"generated_at": now.isoformat(), "pending": [t.to_dict() for t in transactions]})
    else:
        output.print_pending(transactions, now)
    return EXIT_OK


def run_resolve(args: argparse.Namespace) -> int:
    """End a pending transaction, or commit a discarded one, by hand (:mod:`coordinator.ops.resolve`);
    exit 2, writing nothing, if it cannot be ended so or the reason is missing.

    Example::

        $ txcoord resolve 01a2... --rollback --reason "order cancelled by support" --config conf/coordinator.toml
    """
    from coordinator.ops.resolve import resolve_transaction
    from coordinator.protocol import LocalTransactionState

    try:
        record = resolve_transaction(CoordinatorConfig.load(args.config), args.transaction_id,
                                     LocalTransactionState(args.decision), args.reason)
    except InvalidArgumentError as error:
        print(f"txcoord resolve: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        output.print_json({key: record[key] for key in ("transaction_id", "producer_group", "state", "check_id",
                                                        "properties", "born_timestamp")})
    else:
        print(f"{record['state']} of transaction {record['transaction_id']} (group {record['producer_group']}) "
              f"sent as {record['check_id']}; the checker applies it at its next batch (`txcoord inspect` to follow)")
    return EXIT_OK


def run_inspect(args: argparse.Namespace) -> int:
    """Print one transaction's timeline (:mod:`coordinator.ops.audit`); exit 1 if no table knows it.

    Example::

        $ txcoord inspect 3f2a9c... --config demo-lakehouse/demo.toml
    """
    from coordinator.ops.audit import outcome, transaction_timeline

    config = CoordinatorConfig.load(args.config)
    events = transaction_timeline(Lakehouse.of(config), args.transaction_id)
    if args.json:
        output.print_json({"transaction_id": args.transaction_id, "outcome": outcome(events) if events else None,
                     "events": [event.to_dict() for event in events]})
    else:
        output.print_timeline(args.transaction_id, events)
    return EXIT_OK if events else EXIT_FAILED


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (see :mod:`coordinator.demo`); its exit code says whether the invariant held."""
    from coordinator.demo import story as demo

    out = functools.partial(print, flush=True, file=sys.stderr if args.json else sys.stdout)
    try:
        return demo.run_demo(args.lakehouse, orders=args.orders, threads=args.threads, seed=args.seed,
                             timeout_s=args.timeout, out=out, on_outcome=output.print_json if args.json else None,
                             object_store=args.object_store)
    except demo.DemoError as error:
        print(f"txcoord demo: {error}", file=sys.stderr)
        return EXIT_USAGE


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
    return _print_grants(args, config, {group_principal(args.group)}, created)


def run_grants(args: argparse.Namespace) -> int:
    """Print every principal's grants (:func:`coordinator.ops.tenancy.access_plan`), and with ``--account``
    on an S3 lakehouse, the bucket policy that gives them.

    Example::

        $ txcoord grants --config conf/coordinator.toml --account checker=svc-checker --account operators=alice
    """
    return _print_grants(args, CoordinatorConfig.load(args.config), None, [])


def _print_grants(args: argparse.Namespace, config: CoordinatorConfig, only: Optional[set[str]],
                  created: list[str]) -> int:
    from coordinator.commit_logs import CommitLogs
    from coordinator.ops.tenancy import access_plan, merged_policy, s3_bucket_policy

    lakehouse = Lakehouse.of(config)
    plan = [grant for grant in access_plan(CommitLogs(lakehouse).groups()) if only is None or grant.principal in only]
    accounts = _accounts(args.account)
    policy = (s3_bucket_policy(lakehouse.root, accounts, refuse_overwrites=not args.allow_overwrites)
              if accounts and not lakehouse.is_local else None)
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
        output.print_json({"lakehouse": lakehouse.root, "created": created,
                           "grants": [dataclasses.asdict(grant) for grant in plan], "s3_bucket_policy": policy})
    else:
        output.print_grants(lakehouse.root, plan, created, policy)
    return EXIT_OK


def _accounts(pairs: Optional[list[str]]) -> dict[str, list[str]]:
    from coordinator.ops.tenancy import ANALYSTS, CHECKER, OPERATORS, group_principal

    accounts: dict[str, list[str]] = {}
    for pair in pairs or ():
        principal, _, account = pair.partition("=")
        if not account or not principal:
            raise ConfigError(f"--account takes PRINCIPAL=ACCOUNT, got {pair!r}")
        if principal not in (CHECKER, OPERATORS, ANALYSTS):
            principal = group_principal(principal)
        accounts.setdefault(principal, []).append(account)
    return accounts


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


def main(argv: Optional[list[str]] = None) -> int:
    """Parse ``argv`` and run the subcommand; return the exit code.

    Example::

        main(["init", "--config", "conf/coordinator.toml"])  # 0
    """
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as error:
        print(f"txcoord {args.command}: configuration error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (LakehouseNotFoundError, OutdatedLakehouseError, SparkSetupError) as error:
        print(f"txcoord {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (AccessDeniedError, StorageUnavailableError) as error:  # the storage's answer says it all: no traceback
        print(f"txcoord {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"txcoord {args.command}: interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    from importlib.metadata import version

    return version("txcoord")


def _spark_jobs() -> dict[str, str]:
    from coordinator.spark.submit import JOBS

    return JOBS


def _grant_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--account", action="append", metavar="PRINCIPAL=ACCOUNT",
                         help="for a lakehouse on S3, also print a bucket policy giving ACCOUNT the grants of PRINCIPAL "
                              "(checker, operators, analysts or a group's name; repeatable)")
    command.add_argument("--allow-overwrites", action="store_true",
                         help="with --account: leave out the statements refusing an overwrite of a commit (a PUT "
                              "without If-None-Match), for an S3-compatible server that refuses a policy naming the "
                              "s3:if-none-match condition key (versitygw 1.8: see docs/known-limits.md)")
    command.add_argument("--merge-into", metavar="POLICY_JSON",
                         help="with --account: print the whole bucket policy, this one (the bucket's current policy, "
                              "as `aws s3api get-bucket-policy --query Policy --output text` prints it) with the "
                              "statements of the principals given put in place, every other statement kept")


def _common_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    command.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def _retention(text: str) -> int:
    from coordinator.ops.maintenance import MIN_RETENTION_HOURS

    return _at_least(MIN_RETENTION_HOURS, text, "a shorter vacuum deletes files that writers commit while it runs")


def _log_retention(text: str) -> float:
    from coordinator.ops.maintenance import log_retention_interval

    try:
        hours = float(text)
        log_retention_interval(hours)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a positive number of hours: {text!r}") from None
    return hours


def _duration(text: str) -> float:
    from coordinator.durations import parse_duration

    try:
        return parse_duration(text)
    except InvalidArgumentError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _port(text: str) -> int:
    value = _at_least(0, text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, got {value}")
    return value


def _refresh(text: str) -> int:
    return _at_least(1, text)


def _order_count(text: str) -> int:
    from coordinator.demo.services import MIN_ORDERS

    return _at_least(MIN_ORDERS, text, "one order per fate")


def _thread_count(text: str) -> int:
    return _at_least(1, text)


def _at_least(minimum: int, text: str, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}" + (f" ({why})" if why else "") + f", got {value}")
    return value

