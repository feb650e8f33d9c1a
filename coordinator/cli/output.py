"""What the ``txcoord`` commands print for people: rich text, one record per line when not on a
terminal; and ``--json`` documents for scripts."""

from __future__ import annotations

import json
from typing import Optional

from coordinator.durations import format_duration

__all__ = ["console", "print_grants", "print_json", "print_maintenance", "print_pending", "print_spark_setup",
           "print_status", "print_timeline"]

_UNFOLDED = 10_000  # console width when not writing to a terminal


def print_json(document: object) -> None:
    """``document`` as indented JSON on stdout; values JSON lacks (timestamps) as their text."""
    print(json.dumps(document, indent=2, default=str))


def console(stderr: bool = False):
    """A rich console on stdout (or ``stderr``) that never folds lines into a file or a pipe."""
    from rich.console import Console

    console = Console(highlight=False, stderr=stderr)
    # Into a file or a pipe, no line is folded: scripts and logs read each record on one line.
    return console if console.is_terminal else Console(highlight=False, stderr=stderr, width=_UNFOLDED)


def print_status(status) -> None:
    """``txcoord status``: one line per fact of a :class:`~coordinator.ops.status.Status`."""
    if status.checker_alive:
        checker = (f"[green]alive[/green]: {status.checker_holder}, lease renewed "
                   f"{format_duration(status.lease_renewed_age_s)} ago")
    elif status.checker_process_gone:
        checker = (f"[red]not running[/red]: {status.checker_holder} is gone (lease renewed "
                   f"{format_duration(status.lease_renewed_age_s)} ago)")
    elif status.checker_holder:
        checker = (f"[red]not running[/red]: the lease of {status.checker_holder} expired "
                   f"{format_duration(status.lease_renewed_age_s)} ago")
    else:
        checker = "[red]not running[/red] (no lease)"
    if status.last_batch_id is None:
        last_batch = "none recorded"
    else:
        last_batch = (f"#{status.last_batch_id}, finished {format_duration(status.last_batch_age_s)} ago, "
                      f"took {format_duration(status.last_batch_duration_ms / 1000)}")
    if status.lag_versions is None:
        lag = f"unknown ({status.commit_log_versions} commit-log version(s) written)"
    elif status.lag_versions == 0:
        lag = f"none: read all {status.commit_log_versions} commit-log version(s)"
    else:
        lag = (f"{status.lag_versions} of {status.commit_log_versions} commit-log version(s) unread, the oldest "
               f"written {format_duration(status.lag_s)} ago")
    pending = f"{status.pending_transactions} transaction(s)"
    if status.oldest_pending_age_s is not None:
        pending += f", oldest {format_duration(status.oldest_pending_age_s)}"
    out = console()
    for key, value in [
        ("lakehouse", status.lakehouse),
        ("checker", checker),
        ("standing by", ", ".join(status.standby_checkers) or "no checker"),
        ("last batch", last_batch),
        ("lag", lag),
        ("pending", pending),
        ("checks due", str(status.checks_due)),
        ("checks issued", str(status.checks_issued)),
        ("discarded", f"{status.discarded} transaction(s)"
                      + (f", {status.recovered} committed since by an operator" if status.recovered else "")),
        ("rejected", f"{status.rejected} record(s)"),
    ] + [(f"  {reason}", str(count)) for reason, count in status.rejected_by_reason.items()]:
        out.print(f"{key:<15}{value}")


def print_timeline(transaction_id: str, events) -> None:
    """``txcoord inspect``: the outcome, then one row per event of the timeline."""
    from rich.table import Table

    from coordinator.ops.audit import outcome

    out = console()
    if not events:
        out.print(f"no table mentions transaction {transaction_id}")
        return
    out.print(f"transaction {transaction_id}: [bold]{outcome(events)}[/bold], {len(events)} events "
                  f"from {events[0].at:%Y-%m-%d %H:%M:%S} to {events[-1].at:%H:%M:%S} UTC")
    rewritten = [event for event in events if event.step == "commit rewritten"]
    if rewritten:  # above the table: the commit-log rows in it may not be what the checker decided on
        out.print(f"[bold red]{len(rewritten)} commit(s) holding this transaction's records REWRITTEN since the "
                  "checker read them[/bold red]: their rows below may not be what the checker decided on")
    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    for column in ("time", "step", "table"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail", overflow="fold")
    for event in events:
        table.add_row(event.at.strftime("%H:%M:%S.%f")[:-3], event.step, event.table, event.detail)
    out.print(table)


def print_maintenance(results, retention_hours: int, log_retention_hours: Optional[float]) -> None:
    """``txcoord maintain``: one row per table maintained, then what was vacuumed."""
    from rich.table import Table

    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    for column in ("table", "files", "compacted", "vacuumed", "version"):
        table.add_column(column, no_wrap=True, justify="left" if column == "table" else "right")
    table.add_column("skipped", overflow="fold")
    for result in results:
        if result.failed:
            table.add_row(result.table, "", "", "", "", f"FAILED: {result.failed}")
            continue
        table.add_row(result.table, f"{result.files_before} → {result.files_after}", str(result.files_compacted),
                      str(result.files_vacuumed), str(result.version), "; ".join(result.skipped))
    out = console()
    out.print(table)
    out.print(f"{sum(not result.failed for result in results)} table(s) maintained; files removed more than {retention_hours} h ago were vacuumed"
                  + ("" if log_retention_hours is None else f"; logs keep commits for {log_retention_hours:g} h"))


def print_grants(root: str, grants, created: list[str], policy: Optional[dict]) -> None:
    """``txcoord grants`` and ``add-group``: what was created, then one row per grant, then the bucket policy."""
    from rich.table import Table

    out = console()
    for path in created:
        out.print(f"created {path}")
    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    for column in ("principal", "access", "prefix"):
        table.add_column(column, no_wrap=column != "prefix", overflow="fold")
    for grant in grants:
        table.add_row(grant.principal, ", ".join(grant.access),
                      f"{root.rstrip('/')}/{grant.prefix}" + (" (this key only)" if grant.exact else ""))
    out.print(table)
    if policy is not None:
        out.print("S3 bucket policy for the accounts given (a bucket has one policy, replaced whole: pass every "
                  "principal's --account, or add these statements to the policy in place):")
        print(json.dumps(policy, indent=2))


def print_pending(transactions, now) -> None:
    """``txcoord pending``: one row per pending transaction as of ``now``, oldest first, then a count."""
    from rich.table import Table

    out = console()
    if not transactions:
        out.print("no pending transaction")
        return
    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    for column in ("transaction", "group", "age", "checks", "next", "addressed to", "topics"):
        table.add_column(column, no_wrap=True)
    for t in transactions:
        wait = (t.next_step_at - now).total_seconds()
        when = (f"in {format_duration(wait)}" if wait > 0 else f"due {format_duration(-wait)} ago" if wait < 0
                else "due now")
        table.add_row(t.transaction_id, t.producer_group, format_duration(t.age_s), str(t.checks),
                      f"{t.next_step}: withheld" if t.withheld else f"{t.next_step} {when}",
                      t.addressed_to or ("any instance" if t.checks else "-"), ", ".join(t.topics))
    out.print(table)
    out.print(f"{len(transactions)} pending transaction(s)")
    for t in transactions:
        if t.withheld:
            out.print(f"{t.transaction_id}: committed, delivery withheld: {t.withheld}", markup=False, highlight=False)



def print_spark_setup(properties, jars: list[str], provider: Optional[str], archive, conf_dir,
                      jobs: dict[str, str]) -> None:
    """``txcoord spark-setup``: where Delta comes from, the driver's class archive, and the spark-submit
    command line of each job."""
    out = console()
    if provider:
        out.print(f"Spark already has Delta ({provider}): nothing downloaded, its own configuration applies")
    else:
        folder = jars[0].rsplit("/", 1)[0] if jars else "(none)"
        out.print(f"{len(jars)} jars cached in {folder}")
        out.print(f"driver class archive: {archive}" if archive else
                  "driver class archive: none (jobs start slower; `txcoord spark-setup` writes it)")
    environment = f"SPARK_CONF_DIR={conf_dir} " if conf_dir else ""
    options = f"--properties-file {properties} " if properties else ""
    for name, script in jobs.items():
        out.print(f"{name}: {environment}spark-submit [--master URL] {options}{script} --config FILE")
