"""The checker on a real Spark cluster: a standalone master and workers on this machine.

Starts a Spark standalone master and ``--workers`` workers (one core, ``--worker-memory``
each) from the Spark that pyspark installed, submits the very same checker job
(``coordinator/jobs/checker.py``) to it with ``spark-submit --master spark://…``, runs a workload through it (commits,
rollbacks, lost second phases repaired by check-back, one transaction nobody can decide),
checks the outcome, stops the checker with SIGTERM and the cluster, and prints a summary.

    .venv/bin/python -m scripts.cluster                  # exit 0: every check held
    .venv/bin/python -m scripts.cluster --json           # the summary as JSON
    .venv/bin/python -m scripts.cluster --keep DIR       # keep the lakehouse and logs in DIR

Exit status: 0 every check held, 1 one failed (the summary says which), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from coordinator import CoordinatorConfig, LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.spark import spark_submit
from coordinator.lakehouse import Lakehouse, init_lakehouse, read_table
from coordinator.ops.status import read_metrics
from coordinator.tables import DISCARDED, OP
from support import Job, free_port, wait_until

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
TOPIC = "CLUSTER_TOPIC"
#: Short timings, so the undecidable transaction is discarded within seconds.
SETTINGS = {"transaction_timeout_ms": 2000, "transaction_check_interval_ms": 2000, "transaction_check_max": 2,
            "trigger_interval_ms": 1000}
#: How each transaction of the workload goes: (first phase, check-back answer).
PLAN = {"commit": (COMMIT, COMMIT), "rollback": (ROLLBACK, ROLLBACK), "lost-commit": (UNKNOW, COMMIT),
        "lost-rollback": (UNKNOW, ROLLBACK), "undecidable": (UNKNOW, UNKNOW)}


class PlannedListener(TransactionListener):
    """Answers as the transaction's key (its fate in ``PLAN``) says."""

    def execute_local_transaction(self, msg, arg):
        return PLAN[msg.keys.split("/")[0]][0]

    def check_local_transaction(self, msg):
        return PLAN[msg.keys.split("/")[0]][1]


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def daemon(stack: ExitStack, argv: list[str], log: Path, env: dict[str, str]) -> Job:
    """``argv`` started, its output in ``log``; stopped (SIGTERM, SIGKILL after 30 s) when ``stack`` closes."""
    job = Job(argv, log, env=env).start()
    stack.callback(job.stop, 30)
    return job


def start_cluster(stack: ExitStack, work: Path, workers: int, worker_memory: str, env: dict[str, str]) -> tuple[str, int]:
    """Start a master and ``workers`` workers; return ``(master URL, master web UI port)``."""
    port, ui_port = free_port(), free_port()
    master = daemon(stack, [str(spark_class()), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(port), "--webui-port", str(ui_port)], work / "master.log", env)
    master.wait_for(lambda: master.logged("I have been elected leader"), "the master's election", 120)
    url = f"spark://127.0.0.1:{port}"
    for index in range(workers):
        worker = daemon(stack, [str(spark_class()), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                "--cores", "1", "--memory", worker_memory, "--webui-port", str(free_port()),
                                "--work-dir", str(work / f"worker-{index}"), url],
                        work / f"worker-{index}.log", env)
        worker.wait_for(lambda: worker.logged("Successfully registered with master"), f"worker {index}'s registration", 120)
    return url, ui_port


def cluster_state(ui_port: int) -> dict:
    """The master's own account of its workers and applications (its web UI's JSON)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=10) as response:
        return json.load(response)


def send_workload(config: CoordinatorConfig, per_fate: int) -> dict[str, str]:
    """Send ``per_fate`` transactions of each fate in ``PLAN``; return ``{transaction id: fate}``."""
    fates = {}
    with TransactionProducer("cluster_group", PlannedListener(), config) as producer:
        for fate in PLAN:
            for index in range(per_fate):
                result = producer.send_message_in_transaction(Message(TOPIC, f"{fate} {index}".encode(), keys=f"{fate}/{index}"))
                fates[result.transaction_id] = fate
        # Stay up to answer the checks: until every transaction is resolved.
        wait_until(lambda: len(outcomes(config.lakehouse)) == len(fates), 600, "every transaction resolved", poll_s=1)
    return fates


def outcomes(lakehouse: str) -> dict[str, str]:
    return dict(zip(*read_table(Lakehouse(lakehouse).path(OP), ["transaction_id", "outcome"]).to_pydict().values()))


def run(work: Path, workers: int, worker_memory: str, per_fate: int) -> dict:
    """The whole run in ``work``; returns the summary (``failures`` empty when every check held)."""
    started = time.monotonic()
    lakehouse = work / "lakehouse"
    conf = work / "cluster.toml"
    conf.write_text(f"lakehouse = {json.dumps(str(lakehouse))}\n" + "".join(f"{k} = {v}\n" for k, v in SETTINGS.items()))
    config = CoordinatorConfig.load(conf, environ={})
    init_lakehouse(Lakehouse.of(config))  # as `txcoord init` does before a deployment's first start
    argv, env = spark_submit("checker", "--config", str(conf))
    env = {k: v for k, v in env.items() if not k.startswith("TXCOORD_")} | {"SPARK_LOCAL_IP": "127.0.0.1"}
    summary: dict = {"workers": workers, "worker_memory": worker_memory, "failures": []}
    with ExitStack() as stack:
        master_url, ui_port = start_cluster(stack, work, workers, worker_memory, env)
        summary["master"] = master_url
        summary["cluster_started_s"] = round(time.monotonic() - started, 1)
        submit = [argv[0], "--master", master_url, "--executor-memory", worker_memory,
                  "--total-executor-cores", str(workers), *argv[1:]]
        checker = daemon(stack, submit, work / "checker.log", env)
        fates = send_workload(config, per_fate)
        apps = cluster_state(ui_port)["activeapps"]
        summary["application"] = [{"name": a["name"], "cores": a["cores"], "state": a["state"]} for a in apps]
        wait_until(lambda: read_table(Lakehouse(lakehouse).topic(TOPIC)).num_rows >= 2 * per_fate, 120, "every delivery", poll_s=1)
        summary["settled_s"] = round(time.monotonic() - started, 1)
        summary["checker_exit"] = checker.stop(120)
    summary["seconds"] = round(time.monotonic() - started, 1)

    expected = {txn: {"commit": "COMMIT", "lost-commit": "COMMIT", "rollback": "ROLLBACK", "lost-rollback": "ROLLBACK",
                      "undecidable": "DISCARD"}[fate] for txn, fate in fates.items()}
    delivered = read_table(Lakehouse(lakehouse).topic(TOPIC), ["transaction_id"]).column(0).to_pylist()
    discarded = read_table(Lakehouse(lakehouse).path(DISCARDED), ["transaction_id"]).column(0).to_pylist()
    batches = read_metrics(str(lakehouse), ["batch_id"]).column("batch_id").to_pylist()
    summary |= {"transactions": len(fates), "delivered": len(delivered), "discarded": len(discarded), "batches": len(batches)}
    checks = [
        (outcomes(str(lakehouse)) == expected, "every transaction ended as planned"),
        (sorted(delivered) == sorted(t for t, o in expected.items() if o == "COMMIT"), "each committed message delivered once"),
        (sorted(discarded) == sorted(t for t, o in expected.items() if o == "DISCARD"), "the undecidable ones discarded"),
        (any(a["name"] == "txcoord-checker" and a["cores"] == workers for a in summary["application"]),
         f"the checker ran on the cluster with {workers} executor cores"),
        (summary["checker_exit"] == 0, "the checker exited 0 on SIGTERM"),
        (batches == list(range(len(batches))) and len(batches) > 0, "system/metrics recorded every batch once"),
    ]
    summary["failures"] = [what for held, what in checks if not held]
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="workers, one core each (default: %(default)s)")
    parser.add_argument("--worker-memory", default="1g", help="memory of each worker and executor (default: %(default)s)")
    parser.add_argument("--per-fate", type=int, default=3, help=f"transactions of each fate: {', '.join(PLAN)} (default: %(default)s)")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary directory, removed)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="txcoord-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        summary = run(work, args.workers, args.worker_memory, args.per_fate)
    except RuntimeError as error:
        summary = {"failures": [str(error)], "logs": str(work)}
        args.keep = args.keep or str(work)  # keep the logs of a failed run
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key:<18}{value}")
        print("FAILED: " + "; ".join(summary["failures"]) if summary["failures"] else "every check held")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
