"""Backlog drain: how fast the checker works off a backlog, side by side with a reference commit.

Two trees take part: this checkout, and a git worktree of ``--reference-commit`` (default
28c6e6f, the checker that decided record by record in Python; ``--reference-tree`` names an
existing checkout instead), made for the run and removed after it. Each tree runs in processes of
its own, with its own code (``PYTHONPATH``), its own producer, its own checker job and its own
benchmark scripts, so each side is measured as a user of that commit would run it.

Five parts, each run ``--rounds`` times for both trees, one tree after the other (the order alternates
from round to round, so a machine that slows down mid-run hits both alike):

* **drain**: an empty local lakehouse; the tree's ``TransactionProducer``
  commits ``--transactions`` transactions from 64 threads with no checker running; then the tree's
  checker job (``spark-submit jobs/checker.py``, 100 ms trigger) starts and works the backlog off.
  From ``system/metrics``: the batches that delivered, the time from the first one's start to the
  last one's end, and the drain rate, transactions / that time. The topic table is then read back:
  every transaction delivered once.
* **batch**: the tree's ``bench/batch_cost.py`` (batches of 200 transactions: the batch logic
  alone, and a trigger of the real streaming query), median seconds.
* **e2e**: the tree's ``bench/e2e.py`` at ``--e2e-rate`` for ``--e2e-seconds``: commit→visible
  p50 and p99.
* **cold_start**: the tree's ``bench/cold_start.py`` (``--cold-runs`` runs): seconds from launching the
  checker job on a fresh lakehouse to its first batch, median.
* **failover**: the tree's ``bench/failover.py`` (``--failover-kills`` kills per mode): seconds from
  killing the active checker to the next one's first batch, a hot standby's and a restarted one's, median.

Ratios are this tree / the reference; issue 27's targets: drain ≥ 4; the 200-transaction batch,
commit→visible, cold start and failover at most 1 (within the noise of a shared machine).

    python -m bench.drain
    python -m bench.drain --rounds 2 --parts drain
    python -m bench.drain --tiny        # the smallest run: a drain of 200 transactions (bench/tests/test_bench.py)
    python -m bench.drain --storage-latency-ms 25 --transactions 5000 --parts drain
                                        # the drain on the S3 server, 25 ms added to every request

With ``--storage-latency-ms N`` (N > 0; the drain part only: the others run the trees' own benchmark
scripts, which the reference commit's lack the option for) each side's lakehouse is a fresh prefix on
the loopback S3 server behind the storage-fault proxy, N ms added to every request
(``support.LatencyStore``, started once by this process): the side's producer through one proxy,
its checker job's whole ``[storage]`` (its Spark checkpoint through S3A included) through another, the
side's own reads straight. Each drain then also reports the producer's and the checker's requests by
kind, per million transactions, priced at S3's list prices.

Prints a table and writes ``bench/results/drain.json`` (``drain-s3-<N>ms.json`` with
``--storage-latency-ms N``; ``--results`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: The last commit whose checker decided record by record (issue 27's reference).
REFERENCE_COMMIT = "28c6e6f"
GROUP = "bench-drain"
TOPIC = "BENCH_DRAIN"
BODY = b"x" * 100
SENDER_THREADS = 64
PARTS = ("drain", "batch", "e2e", "cold_start", "failover")
#: ``--tiny``: a drain of 200 transactions, once per tree.
TINY = {"transactions": 200, "rounds": 1, "parts": ["drain"]}


# ---------------------------------------------------------------------------------------------
# One side: runs inside a tree, with that tree's code (``--side``)


def side_helpers(side: Path):
    """The benchmark helpers of the tree a side runs in (first on ``sys.path``): its ``support`` package, its
    ``bench.harness`` from before ``support/`` was their one home, or the ``benchlib`` module of a tree from
    before ``bench/`` was a package (28c6e6f)."""
    if (side / "support" / "__init__.py").is_file():
        import support as helpers
    elif (side / "bench" / "harness").is_dir():
        from bench import harness as helpers
    else:
        import benchlib as helpers
    return helpers


def drain_side(helpers, transactions: int, workdir: str, startup_timeout_s: float,
               object_store: Optional[dict] = None) -> dict:
    """Commit ``transactions`` with no checker running, then start the checker and wait until it has
    delivered them all; the drain's figures. Uses only what every tree's helpers (``helpers``) and public
    API have. The lakehouse is local, or ``object_store``'s: its ``root``, and the storage options each
    party reaches it with (``producer``, ``checker``, and ``direct`` for this side's own reads)."""
    from deltalake import DeltaTable

    from coordinator import Message, TransactionProducer
    from coordinator.config import CoordinatorConfig
    from coordinator.lakehouse import Lakehouse, init_lakehouse
    from coordinator.tables import METRICS

    if object_store is None:
        lakehouse = Lakehouse(os.path.join(workdir, "lakehouse"))
        producer_storage, checker_lakehouse = {}, lakehouse
    else:
        lakehouse = Lakehouse(object_store["root"], object_store["direct"])
        producer_storage = object_store["producer"]
        checker_lakehouse = Lakehouse(object_store["root"], object_store["checker"])
    init_lakehouse(lakehouse)
    failures = []

    def send(_: int) -> None:
        try:
            producer.send_message_in_transaction(Message(TOPIC, BODY))
        except Exception as error:  # counted; a drain of fewer transactions would say nothing
            failures.append(repr(error))

    with TransactionProducer(GROUP, helpers.Commits(),
                             CoordinatorConfig(lakehouse=lakehouse.root, storage=producer_storage)) as producer:
        send_seconds = helpers.send_on_schedule(send, transactions, 0, SENDER_THREADS)
    if failures:
        raise RuntimeError(f"{len(failures)} sends failed building the backlog, the first: {failures[0]}")
    print(f"  backlog of {transactions} transactions committed in {send_seconds:.1f} s; starting the checker",
          flush=True)

    config_path = helpers.write_config(checker_lakehouse, workdir, trigger_interval_ms=100)
    metrics_path = lakehouse.path(METRICS)
    storage = lakehouse.storage or None
    with helpers.CheckerJob(config_path, lakehouse, os.path.join(workdir, "checker.log")) as checker:
        versions = checker.latest_commit_log_version() + 1
        start_s = checker.wait_ready(startup_timeout_s)
        deadline = time.monotonic() + max(600.0, transactions / 500)
        while _delivered(metrics_path, storage) < transactions:
            if time.monotonic() > deadline or checker.process.poll() is not None:
                raise RuntimeError(f"the checker has not delivered the backlog; see {workdir}/checker.log")
            time.sleep(0.5)
    batches = DeltaTable(metrics_path, storage_options=storage).to_pyarrow_table().to_pylist()
    working = sorted((b for b in batches if b["delivered"]), key=lambda b: b["started_at"])
    seconds = (working[-1]["finished_at"] - working[0]["started_at"]).total_seconds()
    after_first = working[1:]
    steady_s = (working[-1]["finished_at"] - working[0]["finished_at"]).total_seconds()
    delivered = helpers.deliveries(lakehouse, TOPIC)
    return {
        "transactions": transactions,
        "backlog_seconds": round(send_seconds, 1),
        "commit_log_versions": versions,
        "checker_start_s": start_s,
        "batches": len(working),
        "records": sum(b["records"] for b in working),
        "drain_seconds": round(seconds, 2),
        "batch_seconds": [round(b["duration_ms"] / 1000, 2) for b in working],
        "txn_per_s": round(transactions / seconds, 1),
        "steady_txn_per_s": round(sum(b["delivered"] for b in after_first) / steady_s, 1) if after_first else None,
        "delivered": len(delivered),
        "duplicated": sum(1 for d in delivered.values() if d.rows > 1),
    }


def _delivered(metrics_path: str, storage: Optional[dict] = None) -> int:
    from deltalake import DeltaTable

    with contextlib.suppress(Exception):  # no batch yet, or a listing caught mid-commit: asked again shortly
        return sum(DeltaTable(metrics_path, storage_options=storage).to_pyarrow_table(columns=["delivered"]).column("delivered").to_pylist())
    return 0


# ---------------------------------------------------------------------------------------------
# The run: both trees, part by part


class Tree:
    """A checkout that takes part: ``name`` ("this" or "reference"), its ``root``, its commit, and the
    directories its processes find first on ``PYTHONPATH`` (its own code first of all)."""

    def __init__(self, name: str, root: Path, python_path: tuple[str, ...] = ()):
        self.name, self.root, self.python_path = name, root, (str(root), *python_path)
        self.commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                     text=True, check=True).stdout.strip()

    def benchmark(self, name: str) -> list[str]:
        """The arguments that run this tree's benchmark ``name``: ``-m bench.<name>``, or, in a tree from before
        ``bench/`` was a package, ``bench/<name>.py``."""
        return ["-m", f"bench.{name}"] if (self.root / "bench" / "__init__.py").exists() else [f"bench/{name}.py"]

    def run(self, argv: list[str], timeout_s: float, quiet: bool = False) -> None:
        """``python argv`` inside this tree: its directory, its code first on ``PYTHONPATH``."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([*self.python_path, os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, *argv], cwd=self.root, env=env, check=True, timeout=timeout_s,
                       stdout=subprocess.DEVNULL if quiet else None)


#: Imported by every Python process of the reference tree (a ``sitecustomize`` on its ``PYTHONPATH``):
#: ``coordinator.tables`` lives in the checkout's ``tables/``, which only an editable install maps, and the
#: virtualenv's maps this checkout's.
_TABLES_FINDER = """\
import importlib.util, sys

class _ReferenceTables:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "coordinator.tables":
            return importlib.util.spec_from_file_location(name, {init!r}, submodule_search_locations=[{tables!r}])
        return None

sys.meta_path.insert(0, _ReferenceTables)
"""


def reference_tree(root: Path) -> Tree:
    """The reference checkout made runnable as its ``make setup`` would, from this machine's caches: its
    table definitions importable as ``coordinator.tables``, and, for a checkout that kept its Spark jars
    in its own ``.cache`` (28c6e6f), those jars (copied from this checkout's cache, then checked and
    registered by its own setup, which downloads what is missing)."""
    site = root / ".bench-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_TABLES_FINDER.format(init=str(root / "tables" / "__init__.py"),
                                                                 tables=str(root / "tables")))
    tree = Tree("reference", root, (str(site),))
    if (root / "coordinator" / "spark" / "jars.py").exists():
        return tree  # it keeps its jars in the user's cache, as this checkout does
    from coordinator.spark.jars import cached_jars

    jars = root / ".cache" / "jars"
    jars.mkdir(parents=True, exist_ok=True)
    for jar in cached_jars():
        with contextlib.suppress(FileExistsError):
            os.link(jar, jars / Path(jar).name)
    tree.run(["-c", "from coordinator.checker.session import JARS_DIR, spark_packages; "
                    "(JARS_DIR / '.package').write_text(','.join(spark_packages()) + '\\n')"], timeout_s=120)
    tree.run(["-m", "coordinator.checker.session"], timeout_s=600, quiet=True)
    return tree


@contextlib.contextmanager
def reference_worktree(commit: str):
    """A detached git worktree of ``commit`` in a temporary directory, removed afterwards."""
    directory = tempfile.mkdtemp(prefix="bench-drain-reference-")
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", directory, commit], cwd=ROOT, check=True)
    try:
        yield Path(directory)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", directory], cwd=ROOT, check=False)


def measure_drain(tree: Tree, args, workdir: str, store=None) -> dict:
    out = os.path.join(workdir, "side.json")
    argv = [str(HERE / "drain.py"), "--side", str(tree.root), "--transactions", str(args.transactions),
            "--workdir", workdir, "--side-results", out]
    if store is None:
        tree.run(argv, timeout_s=3600)
        return json.loads(Path(out).read_text())
    import support

    where = os.path.join(workdir, "object-store.json")
    Path(where).write_text(json.dumps({"root": store.new_root(), "direct": store.direct,
                                       **{party: store.storage(party) for party in store.parties}}))
    before = {party: store.counts(party) for party in store.parties}
    tree.run([*argv, "--object-store-json", where], timeout_s=3600)
    figures = json.loads(Path(out).read_text())
    for party in store.parties:
        figures[f"{party}_requests"] = support.request_cost(store.requests_since(party, before[party]),
                                                            figures["transactions"])
    return figures


def measure_batch(tree: Tree, args, workdir: str) -> dict:
    out = os.path.join(workdir, "batch_cost.json")
    tree.run([*tree.benchmark("batch_cost"), "--batches", str(args.batch_rounds), "--floor-repeats", "1",
              "--results", out], timeout_s=1800)
    report = json.loads(Path(out).read_text())
    return {"batch_s_median": report["batches"]["records"]["seconds_median"],
            "trigger_ms_median": report["triggers"]["trigger_ms_median_with_records"]}


def measure_e2e(tree: Tree, args, workdir: str) -> dict:
    out = os.path.join(workdir, "e2e.json")
    tree.run([*tree.benchmark("e2e"), "--rate", str(args.e2e_rate), "--seconds", str(args.e2e_seconds),
              "--threads", "128", "--reference-producer-seconds", "0", "--lakehouse", os.path.join(workdir, "e2e"),
              "--results", out], timeout_s=1800)
    report = json.loads(Path(out).read_text())
    return {key: report[key] for key in ("e2e_p50_ms", "e2e_p99_ms", "missing_after_drain")}


def measure_cold_start(tree: Tree, args, workdir: str) -> dict:
    out = os.path.join(workdir, "cold_start.json")
    tree.run([*tree.benchmark("cold_start"), "--runs", str(args.cold_runs), "--results", out], timeout_s=1800)
    return {"first_batch_s": json.loads(Path(out).read_text())["first_batch_s"]["median"]}


def measure_failover(tree: Tree, args, workdir: str) -> dict:
    out = os.path.join(workdir, "failover.json")
    tree.run([*tree.benchmark("failover"), "--kills", str(args.failover_kills), "--send-seconds", str(args.failover_seconds),
              "--results", out], timeout_s=3600)
    modes = json.loads(Path(out).read_text())["modes"]
    return {"standby_s": modes["standby"]["median_s"], "restart_s": modes["restart"]["median_s"],
            "violations": sum(mode["violations"] for mode in modes.values())}


MEASURES = {"drain": measure_drain, "batch": measure_batch, "e2e": measure_e2e, "cold_start": measure_cold_start,
            "failover": measure_failover}
#: The figures compared, (part, key), each as this tree's median over rounds / the reference's.
FIGURES = (("drain", "txn_per_s"), ("drain", "steady_txn_per_s"), ("batch", "batch_s_median"),
           ("batch", "trigger_ms_median"), ("e2e", "e2e_p50_ms"), ("e2e", "e2e_p99_ms"),
           ("cold_start", "first_batch_s"), ("failover", "standby_s"), ("failover", "restart_s"))


def run_parts(trees: list[Tree], args, store=None) -> dict:
    """Each part for each tree, the order alternating by round; {part: {tree name: [figures per round]}}.
    The drain behind ``store`` (a ``support.LatencyStore``) where given."""
    results = {part: {tree.name: [] for tree in trees} for part in args.parts}
    for part in args.parts:
        for round_ in range(args.rounds):
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                print(f"\n--- {part}, round {round_ + 1}: {tree.name} ({tree.commit})", flush=True)
                workdir = tempfile.mkdtemp(prefix=f"bench-drain-{part}-")
                try:
                    figures = (measure_drain(tree, args, workdir, store) if part == "drain"
                               else MEASURES[part](tree, args, workdir))
                finally:
                    subprocess.run(["rm", "-rf", workdir], check=False)
                print(f"    {figures}", flush=True)
                results[part][tree.name].append(figures)
    return results


def ratios(results: dict) -> dict:
    """This tree / the reference, from the medians over rounds."""
    found = {}
    for part, key in FIGURES:
        if part in results:
            this, reference = (_median(results, part, tree, key) for tree in ("this", "reference"))
            found[key] = None if this is None or not reference else round(this / reference, 3)
    return found


def _shown(figure: Optional[float]) -> str:
    return "-" if figure is None else f"{figure:.4g}"


def _median(results: dict, part: str, tree: str, key: str) -> Optional[float]:
    """The median of one figure over a tree's rounds (``None`` if no round has it: a drain of one batch
    has no steady rate)."""
    values = [figures[key] for figures in results[part][tree] if figures[key] is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=300_000, help="the backlog's committed transactions")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each part per tree")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--batch-rounds", type=int, default=5, help="bench/batch_cost.py's --batches")
    parser.add_argument("--e2e-rate", type=float, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=60)
    parser.add_argument("--cold-runs", type=int, default=3, help="bench/cold_start.py's --runs")
    parser.add_argument("--failover-kills", type=int, default=3, help="bench/failover.py's --kills per mode")
    parser.add_argument("--failover-seconds", type=float, default=60, help="bench/failover.py's --send-seconds")
    parser.add_argument("--reference-commit", default=REFERENCE_COMMIT)
    parser.add_argument("--reference-tree", default=None,
                        help="an existing checkout to compare with (default: a worktree of --reference-commit)")
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for a checker's first batch")
    parser.add_argument("--storage-latency-ms", type=float, default=0,
                        help="the drain part only (the default parts become just it): "
                             "run on the loopback S3 server behind the storage-fault proxy with this many milliseconds "
                             "added to every request, for the producer and the checker (a proxy each, its requests "
                             "counted and priced at S3's list prices); 0 or absent: as without it")
    parser.add_argument("--results", default=None, help="default: bench/results/drain.json (drain-s3-<N>ms.json)")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # the tree one side runs in
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--side-results", help=argparse.SUPPRESS)
    parser.add_argument("--object-store-json", help=argparse.SUPPRESS)  # where the side's lakehouse is, and how reached
    raw = parser.parse_known_args(argv)[0]
    if raw.side:
        # A side imports the tree it measures (its helpers, coordinator, tables), so nothing is imported before this.
        sys.path[:0] = [str(Path(raw.side) / "bench"), raw.side]
        object_store = json.loads(Path(raw.object_store_json).read_text()) if raw.object_store_json else None
        figures = drain_side(side_helpers(Path(raw.side)), raw.transactions, raw.workdir, raw.startup_timeout,
                             object_store)
        Path(raw.side_results).write_text(json.dumps(figures))
        # Once the figures are written, skip the interpreter's shutdown: a clean-clone CI saw this process
        # abort there once ("terminate called without an active exception", a native thread still running).
        sys.stdout.flush()
        os._exit(0)

    from bench import harness

    import support

    args = harness.parse_args(parser, argv, "drain", TINY)
    if args.storage_latency_ms:
        if "--parts" not in (argv if argv is not None else sys.argv[1:]):
            args.parts = ["drain"]
        elif args.parts != ["drain"]:
            parser.error("--storage-latency-ms measures the drain part only: --parts drain")
    args.results = args.results or str(harness.RESULTS / (
        f"drain-s3-{args.storage_latency_ms:g}ms.json" if args.storage_latency_ms else "drain.json"))
    report = harness.start_report("drain", vars(args))
    with contextlib.ExitStack() as stack:
        store = None
        if args.storage_latency_ms:
            store = stack.enter_context(support.LatencyStore(
                args.storage_latency_ms, stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-drain-s3-"))))
            report["storage"] = store.settings()
        reference_root = stack.enter_context(contextlib.nullcontext(Path(args.reference_tree)) if args.reference_tree
                                             else reference_worktree(args.reference_commit))
        trees = [Tree("this", ROOT), reference_tree(reference_root)]
        report["commits"] = {tree.name: tree.commit for tree in trees}
        report["results"] = run_parts(trees, args, store)
    report["ratios"] = ratios(report["results"])
    for tree in ("this", "reference"):
        for figures in report["results"].get("drain", {}).get(tree, []):
            if figures["delivered"] != figures["transactions"] or figures["duplicated"]:
                raise RuntimeError(f"{tree}: {figures['delivered']} of {figures['transactions']} delivered, "
                                   f"{figures['duplicated']} more than once")

    if store is not None:
        print(f"\nrequests behind {args.storage_latency_ms:g} ms ({support.S3_PRICES}), per million transactions:")
        for tree, runs in report["results"]["drain"].items():
            for figures in runs:
                print("  " + tree + ": " + ", ".join(
                    f"{party} {figures[f'{party}_requests']['per_million_transactions']['total']:.0f} requests "
                    f"(${figures[f'{party}_requests']['usd_per_million_transactions']})" for party in ("producer", "checker")))
    print(f"\n{'':>22} {'this':>12} {'reference':>12} {'ratio':>7}")
    for part, key in FIGURES:
        if part in report["results"]:
            this, reference = (_median(report["results"], part, tree, key) for tree in ("this", "reference"))
            print(f"{key:>22} {_shown(this):>12} {_shown(reference):>12} {report['ratios'][key]!s:>7}")
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
