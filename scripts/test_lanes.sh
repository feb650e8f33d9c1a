#!/usr/bin/env bash
# The pytest runs of `make test` (tests/) and `make test-bench` (bench/tests/), after setup, over the directory
# given (default tests/): two lanes at once, each on two workers that steal each other's
# tests when done with their own (the tests wait on Spark triggers, JVM starts and subprocesses much of the
# time, so four at once keep two cores busy):
#   slow  the end-to-end tests that start Spark jobs of their own and the benchmarks' tiny runs; those on
#         the S3 server first (its build, which `make test` starts first, is done by then), those sharing
#         the installed wheel and its demo last (made once for both workers: support/fixtures.py);
#   fast  everything else, each worker with its one shared Spark session.
# Each lane's output is printed when both have ended, then each lane's time; the exit status is non-zero
# if any lane failed. Every test's time is in the lane's JUnit report (.cache/lanes/<tree>/<lane>.xml).
set -u
cd "$(dirname "$0")/.."
python=.venv/bin/python
tree=${1:-tests}
logs=.cache/lanes/$(echo "$tree" | tr / -)
mkdir -p "$logs"
started=$(date +%s)

lane() {
  local name=$1; shift
  local begun
  begun=$(date +%s)
  "$python" -m pytest -q --durations=10 --junitxml="$logs/$name.xml" "$@" > "$logs/$name.log" 2>&1
  echo "$? $(( $(date +%s) - begun ))" > "$logs/$name.result"
}

lanes=(slow fast)
lane slow "$tree" -m slow -n 2 --dist worksteal & slow=$!
lane fast "$tree" -m "not slow" -n 2 --dist worksteal & fast=$!
wait $slow $fast

status=0
summary=()
for name in "${lanes[@]}"; do
  read -r code seconds < "$logs/$name.result"
  echo "--- lane $name: exit $code in $seconds s"
  cat "$logs/$name.log"
  summary+=("$name $seconds s (exit $code)")
  [ "$code" -eq 0 ] || status=1
done
echo "--- test lanes took $(( $(date +%s) - started )) s: $(IFS=,; echo "${summary[*]}" | sed 's/,/, /g')"
exit $status
