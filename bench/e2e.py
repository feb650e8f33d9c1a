"""End to end: from ``send_message_in_transaction`` returning COMMIT to the message being readable
in its topic table, at a sustained offered rate, with the real checker job on the same machine.

First, the reference: the producer alone (no checker running, a temporary lakehouse of its own)
sends from 64 threads for ``--reference-producer-seconds``, as ``bench/producer.py`` measures it.
The offered rate is min(``--rate``, 0.9 × that rate): where the producer alone cannot reach the
requested rate, the run offers 90 % of what it reaches (issue 12), so the figures measure the
checker rather than the producer's backlog. ``--reference-producer-seconds 0`` skips the
reference and offers ``--rate``. The default run offers 1,000 txn/s for 10 minutes, unless that
rule caps it. Both the reference and the offered rate are in the JSON. The reference is one process
whatever ``--processes``.

The checker runs as deployed (``spark-submit jobs/checker.py``, ``--trigger-ms`` trigger). Once
it has run its first batch, one producer process offers that rate for ``--seconds`` from
``--threads`` threads (no-op local transaction that commits, 200-byte body), on a fixed schedule
of rate × seconds sends. Sending stops at ``--seconds`` even when the producer has fallen behind:
the sends never started are reported as ``unsent``, and the achieved rate is the committed sends
over the sending time. Each send's return time and transaction id are kept.

With ``--processes N`` (N > 1) the rate is split evenly over N producer processes, each a fresh
interpreter with a producer of its own (``support.steady_share``) and ``--threads`` threads, offering
rate / N on its own schedule; they are spread round-robin over ``--groups G`` producer groups
(``bench-e2e``, ``bench-e2e-2``, ...; every group may publish to the topic, the checker's TOML having no
``[topic_grants]``), and start sending together once every one has opened its producer
(``support.StartedTogether``): the sending time, the lag's quarters and the drain count from then. Each
hands back every send (transaction id, return time as ``time.time()``, send seconds) and its errors and
unsent sends, and every figure below is over all the processes' sends together; ``by_process`` gives
each one's counts and ``commit_log_appends_by_group`` each group's commit-log versions. With
``--processes 1``, the default, the one producer sends from this process.

Afterwards, for each version of the topic table, its commit timestamp (``commitInfo`` in ``_delta_log``)
and the transaction ids in the files it added give when each message became readable; latency = that
timestamp − the send's return. The checker's lag (commit-log versions written but not yet taken by a
batch, from ``system/_checker_progress.json``) is sampled every second, and in each quarter of
``--seconds`` at least once (``support.LagSampler``): it "kept up" when every message was delivered
within ``--drain`` seconds after sending stopped and the lag in the last quarter of the sending time was
at most 1.5 times that of the second quarter, plus 3 versions (:func:`kept_up`).

With ``--object-store`` the lakehouse (the reference's too) is a prefix of a bucket on a real
S3-compatible server on loopback (``coordinator/conformance/versitygw.py``, started for the run), as
``bench/producer.py --object-store`` does; the checker reaches it through the TOML's ``[storage]``
table, and only its TOML and log stay on the local disk. There the log files' times are the
objects' ``Last-Modified``, in whole seconds: ``e2e_p99_ms_by_log_file_mtime`` has a 1 s resolution,
while the latencies from commitInfo timestamps (milliseconds) are as precise as on a local disk.

    python bench/e2e.py                                  # 1,000 txn/s (or 90 % of the reference) for 10 minutes
    python bench/e2e.py --rate 50 --seconds 30 --threads 8
    python bench/e2e.py --object-store --rate 50 --seconds 30 --threads 8   # the lakehouse on a loopback S3 server
    python bench/e2e.py --observed                       # the same, with the metrics scraped and the console open
    python bench/e2e.py --poison --rate 100 --seconds 60 # twice: alone, then beside a poisoning tenant
    python bench/e2e.py --tiny                           # 10 txn/s for 5 s, for the tests (bench/tests/test_bench.py)
    python bench/e2e.py --storage-latency-ms 25 --rate 100 --seconds 60 --threads 32 --reference-producer-seconds 0
                                                         # on the S3 server, 25 ms added to every request
    python -m bench.e2e --storage-latency-ms 25 --rate 500 --seconds 600 --processes 8 --groups 2 --threads 16
                                                         # issue 45 point 3: 8 processes of 16 threads, 2 groups

With ``--storage-latency-ms N`` (N > 0) the lakehouse is on the loopback S3 server as with
``--object-store``, but the producer and the checker each reach it through a storage-fault proxy of its
own that adds N ms to every request (``support.LatencyStore``): the checker's whole ``[storage]``
(delta-rs, obstore, and Spark's S3A checkpoint) names its proxy, and every producer process goes through
the producer's. The benchmark's own reads (lag, the topic) go straight to the server. Each proxy counts
its party's requests: the producer's from its opening to its closing (with ``--processes``, from before
the first opens to after the last closed), the checker's from the first send until every message is
delivered, each per million transactions and priced at S3's list prices (``support.S3_PRICES``); and,
before sending, the checker's requests over ``--idle-seconds`` with no producer, per second and per day
with their cost.
Every report also gives the checker's trigger time (``system/metrics``' ``duration_ms``) and commit-log
versions per trigger, over the triggers with records that started while the producer sent.

With ``--observed``, the run is watched as operators watch it, to show that watching does not slow the
checker (issue 25: the targets still hold at 1,000 txn/s). The checker's TOML sets ``metrics_port = 0``
(any free port, read from its log line "metrics served at ...") and a thread of this process scrapes
``/metrics`` every second; ``txcoord console`` runs as a process of its own (any free port, a viewer
created for the run) and another thread behaves as a browser with its overview open: it signs in once,
then loads ``/`` and the three charts it embeds, one after the other, again every time the page's meta
refresh says (5 s). Both start when sending starts and stop once the drain is over; a last scrape then
checks the endpoint under load: its ``txcoord_messages_delivered_total`` must equal the rows of the topic
table (scraped again for up to ``--trigger-ms`` × 20, at least 10 s, while it is lower: a batch's counters
are updated once its writes are done). A scrape that fails is tried again twice before it counts as failed.
Reported: ``metrics_scrapes``, ``metrics_scrape_failures`` and ``metrics_scrape_retries``,
``metrics_scrapes_by_quarter`` (the scrapes under way in each quarter of the sending time),
``metrics_scrape_p50_ms``/``p99``/``max`` (successful scrapes), ``console_page_loads`` and
``console_page_load_failures``, ``console_page_load_p50_ms``/``p99``/``max`` (page and charts) and
each request's p50 and max by path (``console_request_p50_ms_by_path``, ``..._max_ms_by_path``),
``metrics_delivered_total`` and ``metrics_delivered_matches``, the console's CPU seconds, the first
errors of each; ``observed`` is in every report, true or false.

With ``--poison``, the run is made twice on fresh lakehouses, the same way: alone, then while a tenant of
its own group writes, into its own prefix, every kind of bytes the checker must refuse
(``support/poisons.py``) every ``POISON_EVERY_S`` seconds of the sending. The report holds both runs'
figures (``without_poison``, ``with_poison``), the poisons written and refused, and the ratio of the two
commit→visible p99s (issue 44: at most 1.25).

Prints a table and writes ``bench/results/e2e.json`` (``bench/results/e2e-s3.json`` with
``--object-store``, ``e2e-s3-<N>ms.json`` with ``--storage-latency-ms N``; with ``--poison``, ``e2e-poison.json``,
``e2e-poison-s3.json``, ``e2e-poison-s3-<N>ms.json``; ``--results`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import time
from pathlib import Path

from bench import harness

import support
from support.poisons import PoisoningTenant
from bench import producer as producer_benchmark  # its reference run, and where lakehouses live
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse

TOPIC = "BENCH_E2E"
#: The producer group of the run; with ``--groups G``, the first of G (:func:`group_name`).
GROUP = "bench-e2e"
#: Issue 12's reference: one producer process alone at 64 sender threads; the run offers at most this share of it.
REFERENCE_THREADS = 64
REFERENCE_SHARE = 0.9
#: A log file's time on object storage is its Last-Modified, an HTTP date: whole seconds.
OBJECT_STORE_MTIME_RESOLUTION_S = 1
#: How much the last quarter's peak lag may exceed the second quarter's for a checker that keeps up. A steady
#: lag is about one batch's worth of commit-log versions, and a sample's value depends on where in a batch it
#: falls and on that batch's length, so it wobbles in proportion to the lag itself (57 against 46 for a steady
#: one): a ratio, not a fixed number of versions. A checker that falls behind gains lag in proportion to time:
#: from nothing, the peak of the last quarter (at the end) is twice that of the second (at mid-run); 1.5 lies
#: between that and a steady 1.
LAG_GROWTH_TOLERANCE = 1.5
#: Versions of slack on top, for runs where the lag is a handful of versions and one extra commit is a large ratio.
LAG_SLACK_VERSIONS = 3
#: ``--tiny``: half a second of reference, then 5 s of sending at 10 txn/s.
TINY = {"rate": 10, "reference_producer_seconds": 0.5, "seconds": 5, "threads": 4, "drain": 60, "idle_seconds": 2}
#: ``--observed``: the metrics scraped every second, the console's overview reloaded as often as it says.
SCRAPE_INTERVAL_S = 1.0
#: The console's default refresh, which the run keeps (its page says so, and the browser follows the page).
CONSOLE_REFRESH_S = 5
#: The Prometheus counter of the messages a checker delivered, by topic.
DELIVERED_SAMPLE = "txcoord_messages_delivered_total"
#: ``--poison``: the poisoning tenant's group, and how often it writes every poison again while the producer sends.
POISON_GROUP = "bench_poison"
POISON_EVERY_S = 3.0
#: ``--poison --storage-latency-ms N``: the poisoning tenant's party, a proxy of its own at the same latency.
POISONER = "poisoner"


def group_name(index: int) -> str:
    """The producer group ``index`` (from 0) of ``--groups``: :data:`GROUP`, then ``bench-e2e-2`` and on. The
    checker's TOML has no ``[topic_grants]`` (``support.write_config``): every group may publish to :data:`TOPIC`.

    Example::

        [group_name(index) for index in range(3)]   # ['bench-e2e', 'bench-e2e-2', 'bench-e2e-3']
    """
    return GROUP if index == 0 else f"{GROUP}-{index + 1}"


def offered_rate(places: producer_benchmark.Places, requested: float,
                 reference_seconds: float) -> tuple[float, dict | None]:
    """The rate to offer, min(``requested``, 0.9 × the producer alone at 64 threads on a fresh lakehouse
    of ``places``), and that reference run (bench/producer.py's figures), or ``(requested, None)`` when
    ``reference_seconds`` is 0."""
    if reference_seconds <= 0:
        return requested, None
    print(f"reference: the producer alone at {REFERENCE_THREADS} threads for {reference_seconds:g} s...", flush=True)
    reference = producer_benchmark.run(places, REFERENCE_THREADS, reference_seconds, 1)
    return min(requested, round(REFERENCE_SHARE * reference["txn_per_s"], 1)), reference


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000,
                        help="requested transactions per second (offered: at most 90 %% of the reference)")
    parser.add_argument("--reference-producer-seconds", type=float, default=5,
                        help="measure the producer alone at 64 threads this long first (0: offer --rate as is)")
    parser.add_argument("--seconds", type=float, default=600, help="sending time")
    parser.add_argument("--threads", type=int, default=128,
                        help="sender threads (of each process with --processes; ≥ rate × send latency in all)")
    parser.add_argument("--processes", type=int, default=1,
                        help="producer processes, each a fresh interpreter with its own producer, offering the rate "
                             "split evenly between them (1: the producer in this process)")
    parser.add_argument("--groups", type=int, default=1,
                        help="producer groups the processes are spread over, round-robin: bench-e2e, bench-e2e-2, ...")
    parser.add_argument("--trigger-ms", type=int, default=CoordinatorConfig().trigger_interval_ms,
                        help="checker trigger_interval_ms (default: the product default)")
    parser.add_argument("--drain", type=float, default=120, help="seconds to wait for the last deliveries")
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for the checker's first batch")
    parser.add_argument("--lakehouse", default=None, help="default: a temporary directory, removed afterwards "
                        "(with --object-store: only the checker's TOML and log go there)")
    parser.add_argument("--object-store", action="store_true",
                        help="the lakehouse on a loopback S3 server (coordinator/conformance/versitygw.py) instead of a local disk")
    parser.add_argument("--observed", action="store_true",
                        help="watch the run as operators do: the checker's metrics endpoint (metrics_port) scraped "
                             "every second, and txcoord console running with a signed-in browser reloading its "
                             "overview and charts every 5 s; reports their counts, failures and durations, and "
                             "whether the delivered counter scraped last matches the topic table")
    parser.add_argument("--poison", action="store_true",
                        help="run twice: alone, then beside a tenant writing every kind of bytes the checker must "
                             f"refuse into its own prefix every {POISON_EVERY_S:g} s; report both and the p99 ratio")
    parser.add_argument("--storage-latency-ms", type=float, default=0, help=support.LATENCY_HELP)
    parser.add_argument("--idle-seconds", type=float, default=30,
                        help="with --storage-latency-ms: count the idle checker's requests this long before sending")
    parser.add_argument("--request-log", default=None, metavar="DIR",
                        help="with --storage-latency-ms: each proxy logs every request to DIR/<party>-requests.jsonl "
                             "(the report then holds the idle and sending windows: python -m bench.trigger_requests)")
    parser.add_argument("--results", default=None,
                        help="default: bench/results/e2e.json (e2e-s3.json, e2e-s3-<N>ms.json; with --poison, "
                             "e2e-poison.json and so on)")
    args = harness.parse_args(parser, argv, "e2e", TINY)
    if not 1 <= args.groups <= args.processes:
        parser.error(f"--processes {args.processes} --groups {args.groups}: a process at least, and a process in "
                     "every group")
    name = "e2e-poison" if args.poison else "e2e"
    args.results = args.results or str(harness.RESULTS / (
        f"{name}-s3-{args.storage_latency_ms:g}ms.json" if args.storage_latency_ms
        else f"{name}-s3.json" if args.object_store else f"{name}.json"))
    report = harness.start_report("e2e", vars(args))
    # With --object-store or a latency, one S3 server for the whole run.
    if args.request_log:
        os.makedirs(args.request_log, exist_ok=True)
    places = producer_benchmark.Places(args.object_store, args.storage_latency_ms,
                                       parties=("producer", "checker") + ((POISONER,) if args.poison else ()),
                                       request_logs=args.request_log)
    if places.store is not None:
        report["storage"] = places.store.settings()
    try:
        rate, reference = offered_rate(places, args.rate, args.reference_producer_seconds)
        if reference is not None:
            print(f"  alone: {reference['txn_per_s']} txn/s (send p99 {reference['send_p99_ms']} ms); offering "
                  f"{rate:g} of the {args.rate:g} requested", flush=True)
        # On the server, a fresh prefix as the producer benchmark makes one; on a local disk the checked
        # run makes its own lakehouse, since --lakehouse may name it.
        if args.poison:
            report.update(poisoned_and_not(args, rate, reference, places))
        else:
            with fresh_object_store(args, places) as object_store:
                report.update(measure(args, rate, reference, object_store, store=places.store))
    finally:
        places.close()
    return harness.finish_report(report, Path(args.results))


def fresh_object_store(args: argparse.Namespace, places: producer_benchmark.Places):
    """A fresh lakehouse on the S3 server as this benchmark reads it (straight, behind a latency),
    or nothing on a local disk (the checked run makes its own, as ``--lakehouse`` may name it)."""
    if places.store is not None:
        return contextlib.nullcontext(places.store.new_lakehouse())
    return places.lakehouse() if args.object_store else contextlib.nullcontext()


def poisoned_and_not(args: argparse.Namespace, rate: float, reference: dict | None,
                     places: producer_benchmark.Places) -> dict:
    """``--poison``: :func:`measure` on a fresh lakehouse alone, then on another beside the poisoning tenant."""
    runs = {}
    for poisoned in (False, True):
        print(f"\n--- {'beside a poisoning tenant' if poisoned else 'alone'}", flush=True)
        with fresh_object_store(args, places) as object_store:
            runs[poisoned] = measure(args, rate, reference, object_store, poison=poisoned, store=places.store)
    alone, beside = runs[False], runs[True]
    ratio = None if not alone["e2e_p99_ms"] or beside["e2e_p99_ms"] is None else round(
        beside["e2e_p99_ms"] / alone["e2e_p99_ms"], 2)
    print(f"\ncommit→visible p99 beside the poisoning tenant / alone: {beside['e2e_p99_ms']} / {alone['e2e_p99_ms']} ms "
          f"= {ratio} (target ≤ 1.25); {beside['poisons_refused']} of {beside['poisons_written']} poisons refused")
    return {"without_poison": alone, "with_poison": beside, "e2e_p99_ratio_with_poison": ratio,
            "kept_up": alone["kept_up"] and beside["kept_up"]}


def measure(args: argparse.Namespace, rate: float, reference: dict | None, object_store: Lakehouse | None,
            poison: bool = False, store: support.LatencyStore | None = None) -> dict:
    """Start the checker on an empty lakehouse (``object_store``, else ``--lakehouse`` or a temporary
    directory), offer ``rate`` for ``--seconds`` (with ``poison``, beside the poisoning tenant) and wait for the
    deliveries; return the report's figures. Behind a latency (``store``), the checker and the producer
    each go through their own proxy, whose requests are counted."""
    from coordinator import TransactionProducer

    report = {}
    settings = {"metrics_port": 0} if args.observed else {}
    directory, checker = support.checker_on_fresh_lakehouse(
        args.lakehouse, "e2e", args.trigger_ms, object_store,
        checker_storage=None if store is None else store.storage("checker"), **settings)
    lakehouse = checker.lakehouse
    sampler = console = scraper = browser = tenant = None
    observed = {}
    try:
        print(f"starting the checker (trigger {args.trigger_ms} ms)...", flush=True)
        if args.observed:  # started while the checker starts
            console = support.ConsoleJob(checker.config_path, os.path.join(directory, "console.log"),
                                          refresh_s=CONSOLE_REFRESH_S)
        report["checker_start_s"] = checker.wait_ready(args.startup_timeout)
        if args.observed:
            scraper, browser = start_observers(checker, console)
        if store is not None:
            idle_from_wall = time.time()
            report["checker_idle"] = idle_requests(store, args.idle_seconds)
            report["windows_wall"] = {"idle": [idle_from_wall, time.time()]}
        senders = (f"{args.threads} threads" if args.processes == 1 else
                   f"{args.processes} processes of {args.threads} threads in {args.groups} group(s)")
        print(f"  first batch after {report['checker_start_s']} s; offering {rate:g} txn/s for {args.seconds:g} s "
              f"from {senders}", flush=True)
        if args.processes == 1:  # else once every process is ready to send
            t0 = time.monotonic()
            sampler = support.LagSampler(checker, t0, window_s=args.seconds)  # a sample in every quarter, for kept_up
            sampler.start()
        producer_storage = lakehouse.storage if store is None else store.storage("producer")
        config = CoordinatorConfig(lakehouse=lakehouse.root, storage=producer_storage)
        if poison:
            # Behind a latency the tenant writes as a producer does: through a proxy at the same latency, with the
            # producers' credentials (the harness has no account per group), its requests counted apart.
            tenant = PoisoningTenant(lakehouse if store is None else Lakehouse(lakehouse.root, store.storage(POISONER)),
                                     POISON_GROUP, POISON_EVERY_S)
        counted_from = None if store is None else {party: store.counts(party) for party in store.parties}
        counted_from_wall = time.time()
        if args.processes == 1:
            if tenant is not None:
                tenant.start()
            sending_from_wall = time.time()
            with TransactionProducer(GROUP, support.Commits(), config) as producer:
                sender = support.SteadySender(producer, TOPIC, rate, args.seconds, args.threads)
                sending_from = time.monotonic()
                send_seconds = sender.run()
            shares = support.SteadyShares([sender.share(GROUP, sending_from_wall, send_seconds)])
        else:
            # Behind a latency every process goes through the producers' proxy, its requests counted as theirs.
            calls = [(lakehouse.root, producer_storage, group_name(index % args.groups), TOPIC,
                      rate / args.processes, args.seconds, args.threads) for index in range(args.processes)]
            with support.StartedTogether(support.steady_share, calls) as processes:
                t0 = sending_from = processes.wait_started()
                sampler = support.LagSampler(checker, t0, window_s=args.seconds)
                sampler.start()
                if tenant is not None:
                    tenant.start()
                shares = support.SteadyShares(processes.results())
            sending_from_wall, send_seconds = shares.started_at, shares.seconds
        if store is not None:
            report["windows_wall"]["sending"] = [sending_from_wall, sending_from_wall + send_seconds]
        if store is not None:
            producer_spent = store.requests_since("producer", counted_from["producer"])
        if tenant is not None:
            tenant.stop()
            if store is not None:
                poisoner_spent = store.requests_since(POISONER, counted_from[POISONER])
        wanted = {tid for tid, _, _ in shares.sent}
        print(f"  sent {len(wanted)} of {shares.total} in {send_seconds:.1f} s ({len(wanted) / send_seconds:.1f} txn/s "
              f"achieved, {shares.errors} errors, {shares.unsent} unsent); waiting for delivery...", flush=True)
        delivered = wait_for_deliveries(lakehouse, wanted, args.drain)
        drained_after = round(time.monotonic() - t0 - send_seconds, 1)
        if store is not None:
            checker_spent = store.requests_since("checker", counted_from["checker"])
            counted_until_wall = time.time()
        if args.observed:
            observed = stop_observers(scraper, browser, console, sum(d.rows for d in delivered.values()),
                                      settle_s=max(10.0, 20 * args.trigger_ms / 1000),
                                      sending=(sending_from, sending_from + send_seconds))
    finally:
        for thread in (sampler, scraper, browser):
            if thread is not None:
                thread.stop()
        if tenant is not None and tenant.is_alive():
            tenant.stop()
        try:
            exit_code = checker.stop()
        finally:
            console_exit_code = None if console is None else console.stop()
    missing = len(wanted - delivered.keys())
    # Once the checker has stopped, every row of the topic against what was sent: each honest message once.
    final = support.deliveries(lakehouse, TOPIC)
    once = support.tally_deliveries(wanted, [tid for tid, found in final.items() for _ in range(found.rows)])

    latencies = sorted(delivered[tid].timestamp_s - returned for tid, returned, _ in shares.sent if tid in delivered)
    by_mtime = sorted(delivered[tid].log_mtime - returned for tid, returned, _ in shares.sent if tid in delivered)
    sends = [seconds for _, _, seconds in shares.sent]
    lag_q2, lag_q4 = sampler.quarter(2), sampler.quarter(4)
    lags = [lag for _, lag, _ in sampler.samples]
    keeping_up = kept_up(missing, max(lag_q2, default=None), max(lag_q4, default=None))

    def ms(value):
        return None if value is None else round(value * 1000, 1)

    figures = {
        "requested_txn_per_s": args.rate,
        "reference_producer_txn_per_s": None if reference is None else reference["txn_per_s"],
        "offered_txn_per_s": rate,
        "processes": args.processes,
        "groups": args.groups,
        "achieved_txn_per_s": round(len(sends) / send_seconds, 1),
        "offered": shares.total,
        "sent": len(sends),
        "send_errors": shares.errors,
        "unsent": shares.unsent,
        "send_seconds": round(send_seconds, 1),
        "delivered": len(wanted) - missing,
        "missing_after_drain": missing,
        "drained_after_s": drained_after,
        "send_p50_ms": ms(harness.percentile(sends, 0.5)),
        "send_p99_ms": ms(harness.percentile(sends, 0.99)),
        "e2e_p50_ms": ms(harness.percentile(latencies, 0.5)),
        "e2e_p99_ms": ms(harness.percentile(latencies, 0.99)),
        "e2e_max_ms": ms(latencies[-1] if latencies else None),
        "e2e_p99_ms_by_log_file_mtime": ms(harness.percentile(by_mtime, 0.99)),
        "lag_max_versions": max(lags, default=None),
        "lag_second_quarter_max": max(lag_q2, default=None),
        "lag_last_quarter_max": max(lag_q4, default=None),
        "kept_up": keeping_up,
        "checker_exit_code": exit_code,
        "observed": args.observed,
        "exactly_once": once.exactly_once,
        "deliveries": once.counts(),
        "by_process": shares.by_process(delivered.__contains__),
        "commit_log_appends_by_group": commit_log_appends_by_group(checker),
        "poisons_written": None if tenant is None else len(tenant.written),
        "poisons_refused": None if tenant is None else tenant.refused(lakehouse),
        **triggers_while_sending(lakehouse, sending_from_wall, sending_from_wall + send_seconds),
    }
    if store is not None:
        figures["producer_requests"] = support.request_cost(producer_spent, len(sends))
        figures["checker_requests"] = support.request_cost(checker_spent, len(wanted) - missing)
        figures["checker_idle"] = report.pop("checker_idle")
        figures["checker_requests_per_trigger"] = requests_per_trigger(lakehouse, checker_spent, counted_from_wall,
                                                                       counted_until_wall)
        if tenant is not None:
            figures["poisoner_requests"] = poisoner_spent
    if args.observed:
        figures.update(observed, console_exit_code=console_exit_code)
    print(f"\n{'procs':>5} {'groups':>6} {'offered':>8} {'achieved':>9} {'sent':>7} {'unsent':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'lag max':>8} {'lag Q2':>7} {'lag Q4':>7} {'kept up':>8}")
    f = figures
    print(f"{f['processes']:>5} {f['groups']:>6} {f['offered_txn_per_s']:>8g} {f['achieved_txn_per_s']:>9} {f['sent']:>7} "
          f"{f['unsent']:>7} {f['e2e_p50_ms']!s:>8} {f['e2e_p99_ms']!s:>8} {f['e2e_max_ms']!s:>8} "
          f"{f['lag_max_versions']!s:>8} {f['lag_second_quarter_max']!s:>7} {f['lag_last_quarter_max']!s:>7} "
          f"{str(f['kept_up']):>8}")
    if args.processes > 1:
        print("by process (group: sent of offered, delivered): " + "; ".join(
            f"{p['group']}: {p['sent']} of {p['offered']}, {p['delivered']}" for p in f["by_process"]))
        print("commit-log versions appended, by group: " + ", ".join(
            f"{group} {appended}" for group, appended in f["commit_log_appends_by_group"].items()))
    print(f"send p50 {f['send_p50_ms']} ms, p99 {f['send_p99_ms']} ms; {missing} not delivered after the drain; "
          f"checker exit code {exit_code}; every message once: {once.exactly_once} {once.counts()}")
    if args.observed:
        print(f"observed: /metrics scraped {f['metrics_scrapes']} times ({f['metrics_scrape_failures']} failed, "
              f"{f['metrics_scrape_retries']} tries again; by quarter of the sending {f['metrics_scrapes_by_quarter']}), "
              f"p50 {f['metrics_scrape_p50_ms']} ms, p99 {f['metrics_scrape_p99_ms']} ms, max {f['metrics_scrape_max_ms']} ms; "
              f"console overview loaded {f['console_page_loads']} times ({f['console_page_load_failures']} failed, "
              f"page and {f['console_charts_per_page']} charts), p50 {f['console_page_load_p50_ms']} ms, "
              f"p99 {f['console_page_load_p99_ms']} ms, max {f['console_page_load_max_ms']} ms; console CPU "
              f"{f['console_cpu_s']} s, exit code {console_exit_code}")
        print("  console requests, p50 (max) ms: " + ", ".join(
            f"{path} {p50} ({f['console_request_max_ms_by_path'][path]})"
            for path, p50 in f["console_request_p50_ms_by_path"].items()))
        print(f"  {DELIVERED_SAMPLE} scraped last: {f['metrics_delivered_total']} against {f['topic_rows']} rows in the "
              f"topic table: {'matches' if f['metrics_delivered_matches'] else 'DOES NOT MATCH'}")
        for error in f["metrics_scrape_errors"] + f["console_page_load_errors"]:
            print(f"  observer error: {error}")
    print(f"checker trigger with records, while sending: p50 {f['trigger_ms_p50']} ms, p99 {f['trigger_ms_p99']} ms "
          f"over {f['triggers_with_records']} triggers, {f['versions_per_trigger_p50']} commit-log versions each (p50)")
    if store is not None:
        print(f"requests ({support.S3_PRICES}):")
        for party in ("producer", "checker"):
            cost = f[f"{party}_requests"]
            if cost["per_million_transactions"] is not None:
                print(f"  {party}: {cost['requests']['total']} for {cost['transactions']} transactions, "
                      f"{cost['per_million_transactions']['total']:.0f} per million, "
                      f"${cost['usd_per_million_transactions']} per million transactions")
        per_trigger = f["checker_requests_per_trigger"]
        print(f"  checker per trigger: {(per_trigger['requests_per_trigger'] or {}).get('total')} requests over "
              f"{per_trigger['triggers']} triggers ({per_trigger['triggers_with_records']} with records), "
              f"trigger p50 {per_trigger['trigger_ms_p50']} ms")
        if tenant is not None:
            print(f"  poisoner: {f['poisoner_requests']['total']} requests")
        idle = f["checker_idle"]
        print(f"  idle checker: {idle['requests_per_s']} requests/s over {idle['seconds']} s, "
              f"{idle['per_day']['total']} a day, ${idle['usd_per_day']} a day")
    if object_store is not None:
        figures["log_file_mtime_resolution_s"] = OBJECT_STORE_MTIME_RESOLUTION_S
        print(f"e2e p99 by log file mtime {f['e2e_p99_ms_by_log_file_mtime']} ms: a "
              f"{OBJECT_STORE_MTIME_RESOLUTION_S} s resolution on object storage (Last-Modified, rounded up)")
    report.update(figures)
    report["reference_producer"] = reference
    report["lag_samples"] = sampler.samples
    if args.lakehouse is None:
        shutil.rmtree(directory, ignore_errors=True)
    return report


def commit_log_appends_by_group(checker: support.CheckerJob) -> dict[str, int]:
    """The commit-log versions each producer group appended over its logs (one per instance of it), the
    version that created each log left out: its group commits of records.

    Example::

        commit_log_appends_by_group(checker)   # {'bench-e2e': 41, 'bench-e2e-2': 39}
    """
    from coordinator.commit_logs import CommitLogRef

    appended: dict[str, int] = {}
    for key, versions in checker.written_versions().items():
        group = CommitLogRef.of(key).group
        if group is not None:
            appended[group] = appended.get(group, 0) + versions - 1
    return dict(sorted(appended.items()))


def idle_requests(store: support.LatencyStore, seconds: float) -> dict:
    """The checker's requests over ``seconds`` with nothing to deliver, per second and per day with their cost."""
    print(f"  counting the idle checker's requests for {seconds:g} s...", flush=True)
    before, started = store.counts("checker"), time.monotonic()
    time.sleep(seconds)
    return support.idle_cost_per_day(store.requests_since("checker", before), time.monotonic() - started)


def triggers_while_sending(lakehouse: Lakehouse, since: float, until: float) -> dict:
    """The checker's triggers with records that started between ``since`` and ``until`` (``time.time()``), from
    ``system/metrics``: their time (``duration_ms``, the whole trigger) at p50 and p99, and the commit-log
    versions each took (the growth of ``commit_log_version`` from the batch before)."""
    batches = support.recorded_batches(lakehouse, 0)
    versions = {b["batch_id"]: b["commit_log_version"] - a["commit_log_version"] for a, b in zip(batches, batches[1:])}
    busy = [b for b in batches if b["records"] and since <= b["started_at"] < until]
    return {"triggers_with_records": len(busy),
            "trigger_ms_p50": harness.percentile([b["duration_ms"] for b in busy], 0.5),
            "trigger_ms_p99": harness.percentile([b["duration_ms"] for b in busy], 0.99),
            "versions_per_trigger_p50": harness.percentile([versions[b["batch_id"]] for b in busy
                                                             if b["batch_id"] in versions], 0.5)}


def requests_per_trigger(lakehouse: Lakehouse, requests: dict, since: float, until: float) -> dict:
    """The checker's ``requests`` (by kind, :func:`support.requests_between`), counted from ``since`` to ``until``
    (``time.time()``), over the triggers ``system/metrics`` records as started between them: how many, with
    records or not, their time (``duration_ms``) at p50 and p99, the rows refused into ``system/rejected``, and
    the requests per trigger by kind."""
    batches = [b for b in support.recorded_batches(lakehouse, since) if b["started_at"] < until]
    durations = [b["duration_ms"] for b in batches]
    return {"triggers": len(batches), "triggers_with_records": sum(1 for b in batches if b["records"]),
            "trigger_ms_p50": harness.percentile(durations, 0.5), "trigger_ms_p99": harness.percentile(durations, 0.99),
            "rejected": sum(b["rejected"] or 0 for b in batches),
            "requests_per_trigger": {kind: round(count / len(batches), 1) for kind, count in requests.items()}
            if batches else None}


def kept_up(missing: int, lag_second_quarter_max: int | None, lag_last_quarter_max: int | None) -> bool:
    """Whether the checker kept up: nothing ``missing`` after the drain, and the last quarter's peak lag
    (it must have been sampled) within :data:`LAG_GROWTH_TOLERANCE` times the second quarter's plus
    :data:`LAG_SLACK_VERSIONS` (no sample in the second quarter counts as no lag).

    Example::

        kept_up(0, 46, 57)   # True: a steady lag
        kept_up(0, 46, 92)   # False: it doubled
    """
    if missing or lag_last_quarter_max is None:
        return False
    return lag_last_quarter_max <= LAG_GROWTH_TOLERANCE * (lag_second_quarter_max or 0) + LAG_SLACK_VERSIONS


def start_observers(checker: support.CheckerJob,
                    console: support.ConsoleJob) -> tuple[support.MetricsScraper, support.ConsoleBrowser]:
    """``--observed``: the metrics scraper on the URL the checker logged and a browser signed in to
    ``console`` with its overview open, both started."""
    metrics_url = support.served_metrics_url(checker.log_path)  # served before the lease, so before the first batch
    if metrics_url is None:
        raise RuntimeError(f"the checker did not log where it serves its metrics; see {checker.log_path}")
    url = console.wait_ready(60)
    scraper = support.MetricsScraper(metrics_url, interval_s=SCRAPE_INTERVAL_S)
    browser = support.ConsoleBrowser(url, console.username, console.password, refresh_s=CONSOLE_REFRESH_S)
    browser.sign_in()
    print(f"  observed: scraping {metrics_url} every {SCRAPE_INTERVAL_S:g} s; {console.username} signed in to "
          f"the console at {url}", flush=True)
    scraper.start()
    browser.start()
    return scraper, browser


def stop_observers(scraper: support.MetricsScraper, browser: support.ConsoleBrowser, console: support.ConsoleJob,
                   topic_rows: int, settle_s: float, sending: tuple[float, float]) -> dict:
    """Stop both observers, scrape once more (again each second for up to ``settle_s`` while the delivered
    counter is below ``topic_rows``: a batch counts its deliveries once its writes are done) and return
    the ``--observed`` figures; ``sending`` is when sending started and ended (``time.monotonic()``)."""
    browser.stop()
    scraper.stop()
    deadline = time.monotonic() + settle_s
    while True:
        scraper.attempt()
        delivered = scraper.value(DELIVERED_SAMPLE)
        if (delivered is not None and delivered >= topic_rows) or time.monotonic() >= deadline:
            break
        time.sleep(1)

    def ms(seconds: list[float], q: float):
        value = harness.percentile(seconds, q)
        return None if value is None else round(value * 1000, 1)

    start, end = sending
    quarters = [(start + q * (end - start) / 4, start + (q + 1) * (end - start) / 4) for q in range(4)]
    return {
        "metrics_scrapes": scraper.attempts,
        # Under way, not started: a scrape that outlasts a quarter still covers it.
        "metrics_scrapes_by_quarter": [sum(1 for began, ended in scraper.spans if began < to and ended >= since)
                                       for since, to in quarters],
        "metrics_scrape_failures": scraper.failures,
        "metrics_scrape_retries": scraper.retried,
        "metrics_scrape_p50_ms": ms(scraper.seconds, 0.5),
        "metrics_scrape_p99_ms": ms(scraper.seconds, 0.99),
        "metrics_scrape_max_ms": ms(scraper.seconds, 1.0),
        "metrics_scrape_errors": scraper.errors,
        "console_page_loads": browser.attempts,
        "console_page_load_failures": browser.failures,
        "console_page_load_p50_ms": ms(browser.seconds, 0.5),
        "console_page_load_p99_ms": ms(browser.seconds, 0.99),
        "console_page_load_max_ms": ms(browser.seconds, 1.0),
        "console_page_load_errors": browser.errors,
        "console_charts_per_page": browser.images,
        "console_request_p50_ms_by_path": {path: ms(seconds, 0.5) for path, seconds in browser.by_path.items()},
        "console_request_max_ms_by_path": {path: ms(seconds, 1.0) for path, seconds in browser.by_path.items()},
        "console_refresh_s": browser.refresh_s,
        "console_cpu_s": console.cpu_seconds(),
        "metrics_delivered_total": None if delivered is None else int(delivered),
        "topic_rows": topic_rows,
        "metrics_delivered_matches": delivered == topic_rows,
    }


def wait_for_deliveries(lakehouse: Lakehouse, wanted: set[str], drain_s: float) -> dict[str, support.Delivery]:
    """The topic table's deliveries (:func:`support.deliveries`) once they hold every ``wanted``
    transaction id, or as they are after ``drain_s`` seconds."""
    deadline = time.monotonic() + drain_s
    delivered = {}
    while time.monotonic() < deadline:
        delivered = support.deliveries(lakehouse, TOPIC)
        if wanted <= delivered.keys():
            break
        time.sleep(1)
    return delivered


if __name__ == "__main__":
    main()
