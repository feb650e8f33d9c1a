"""The benchmarks and the chaos harness, run from the checkout's root as modules:

    python -m bench.run --quick          # the suite's quick mode; --help for the rest
    python -m bench.drain                # backlog drain, side by side with a reference commit
    python -m bench.chaos --tiny         # the invariants under kill -9

Each benchmark prints its figures and writes them to ``bench/results/<name>.json``; ``--tiny`` runs
the smallest version that still goes through the whole benchmark (the tests run every one so).
:mod:`bench.harness` holds a benchmark's report; what they share with the tests is in :mod:`support`;
their own tests are in ``bench/tests/``.
"""
