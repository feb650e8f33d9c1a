#!/usr/bin/env bash
# `make test`'s pytest runs, after setup: three lanes at once, as each leaves CPU idle much of the time
# (its tests wait on Spark triggers, JVM starts and subprocesses):
#   slow               the end-to-end tests that start Spark jobs of their own;
#   s3-and-benchmarks  the benchmarks' tiny runs, then the slow tests on the S3 server (these wait for its
#                      build, which `make test` starts first);
#   fast               everything else, on two workers, each with its one shared Spark session.
# Each lane's output is printed when all have ended, then each lane's time; the exit status is non-zero
# if any lane failed.
set -u
cd "$(dirname "$0")/.."
python=.venv/bin/python
logs=.cache/lanes
mkdir -p "$logs"
started=$(date +%s)

lane() {
  local name=$1; shift
  local begun
  begun=$(date +%s)
  "$python" -m pytest -q --durations=10 "$@" > "$logs/$name.log" 2>&1
  echo "$? $(( $(date +%s) - begun ))" > "$logs/$name.result"
}

lanes=(slow s3-and-benchmarks fast)
lane slow -m "slow and not (benchmark or object_store)" & slow=$!
lane s3-and-benchmarks -m "slow and (benchmark or object_store)" & s3=$!
lane fast -m "not slow" -n 2 --dist worksteal & fast=$!
wait $slow $s3 $fast

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
