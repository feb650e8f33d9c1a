"""Chaos harness: the invariants of docs/design.md#invariants under kill -9, with real processes on this machine.

Runs several producer processes (:mod:`bench.chaos.producer`, each with its own SQLite
store and producer group), the real checker (``spark-submit jobs/checker.py``) and
table maintenance (``coordinator.ops.maintenance.maintain``) at once, then:

- SIGKILLs the checker's whole process group at random moments (mid-batch, as batches
  run back to back) and restarts it at once, as a supervisor would (the new run takes the
  lease over as soon as the killed run's process is gone); with ``--standby`` a second
  checker stands by with its Spark session up, each kill hits the active one, the standby
  takes over, and the killed one, restarted, stands by in its turn. Each kill's failover
  (the kill to the next checker's first finished batch) is reported;
- SIGKILLs producer processes in the middle of their sends and group commits, and
  restarts them at once (a restarted producer skips what it already attempted); each kill is
  planned after a producer's n-th send and triggered by it, never by the clock;
- runs a consumer group's processes (:mod:`bench.chaos.consumers`) on both topics, applying each message's
  effect exactly once in SQLite and logging each listener call's start and end; SIGKILLs them while they
  handle and restarts them at once; pauses them (SIGSTOP, then SIGCONT) for 2 and 5 liveness windows, inside
  a call or from outside; and, as an operator, stops the group to reset it (``reset_consumer_group``) and
  starts it again, and redrives and discards its dead letters while it runs;
- appends hostile records to a forging group's own commit log: malformed ones, and forgeries (claiming
  another group, an operator's mark, a topic the group is not granted);
- commits by hand, as an operator would (``txcoord resolve --commit``), the first transaction the
  checker discards (twice at once: two operators racing) and about half of the others;
- with ``--poison``, a tenant writes into its own prefix every kind of bytes the checker must refuse
  (:mod:`~bench.chaos.poison`).

Once every half is resolved (or the timeout passes), it stops everything gracefully and
checks, from the Delta tables and each producer's SQLite ground truth: every locally
committed transaction's messages are in their topics exactly once, and applied by the consumer
group exactly once, per key in the topic's order (or, of the kind its listener fails, a dead letter; or
discarded, or reset past, as the operator allowed), a key's calls overlapping only across a pause, and
delivered again from where a reset went; nothing else is in any topic; every half is resolved or pending with fewer than ``transaction_check_max``
checks, with the outcome its database dictates (a discarded one an operator committed:
delivered exactly once, a DISCARD then a COMMIT op row per half); no check before immunity,
none beyond the maximum; every hostile record is in ``system/rejected``; neither the checker nor a
producer failed on its own. Prints what it did and what it found, writes both as JSON,
and exits 1 on any violation.

    python -m bench.chaos                                   # the small default run
    python -m bench.chaos --transactions 2000 --checker-kills 5 --producer-kills 8
    python -m bench.chaos --standby                         # kills the active of two checkers
    python -m bench.chaos --object-store                    # the lakehouse on a loopback S3 server
    python -m bench.chaos --object-store --storage-faults   # ... reached through a proxy that injects faults
    python -m bench.chaos --tiny                            # 10 transactions, one kill of each: about a minute
    python -m bench.chaos --poison                          # and a tenant writing bytes the checker must refuse
    python -m bench.chaos --consumer-pauses 6 --consumer-resets 2 --dead-letter-rounds 4   # more consumer events

With ``--object-store`` the lakehouse is a prefix of a bucket on a real S3-compatible server
(``coordinator/conformance/versitygw.py``, started for the run); the run's directory keeps only the logs, the
producers' SQLite stores and the configuration (whose ``[storage]`` table reaches the server).
With ``--storage-faults`` too, every request (the producers', the checker's, its Spark checkpoint's,
maintenance's, the verification's) goes through ``coordinator/conformance/faults.py``, which answers 503
SlowDown and 500, delays, resets connections and drops replies after making the write, at the
rates of ``STORAGE_FAULT_RATES`` until the kills are done; then the faults stop and everything must
settle without a restart. The report adds the faults injected by kind, and how many retries and
recognised own writes the processes logged; the verdict adds two counts: records committed twice
(a commit made again after its reply was lost) and sends that said "not stored" of a half that was.

The parts: :mod:`~bench.chaos.options` (the command line and the run's settings),
:mod:`~bench.chaos.actors` (the checkers, producers, maintenance and the operator, as processes and
threads), :mod:`~bench.chaos.consumer` and :mod:`~bench.chaos.consumers` (a consumer process; the group's
processes, the harness's kills, pauses, resets and dead-letter rounds, and what the verdict reads of them),
:mod:`~bench.chaos.hostile` (the forging writer), :mod:`~bench.chaos.run` (the run, from an
empty lakehouse to the report), :mod:`~bench.chaos.verify` (the invariants, from the tables and the
producers' databases; the consumer group's, from its tables, effects and calls) and :mod:`~bench.chaos.report`
(the printed report).
"""
