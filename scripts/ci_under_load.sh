#!/usr/bin/env bash
# CI under load: RUNS (default 3) consecutive `CI=true bash .ci/run` in fresh clones of HEAD, while two
# CPU-bound processes (stress-ng --cpu 2) run beside them, as on a machine shared with other work.
# Stops at the first failure. Prints each run's time and writes them, with the machine and commit, to
# bench/results/ci-under-load.json. `make test-under-load` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
commit=$(git rev-parse --short HEAD)
if ! command -v stress-ng >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "needs stress-ng (sudo apt-get install stress-ng)" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends stress-ng >/dev/null 2>&1 || \
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends stress-ng >/dev/null; }
fi
work=$(mktemp -d -t txcoord-ci-under-load-XXXX)
stress-ng --cpu 2 --quiet & stress=$!
trap 'kill $stress 2>/dev/null; wait $stress 2>/dev/null || true' EXIT
times=()
for run in $(seq 1 "$runs"); do
  clone="$work/run-$run"
  git clone -q . "$clone" && git -C "$clone" checkout -q "$commit"  # every run of the same commit
  echo "run $run of $runs: $clone (log: $clone.log)"
  start=$(date +%s)
  status=0
  (cd "$clone" && CI=true bash .ci/run) > "$clone.log" 2>&1 < /dev/null || status=$?
  seconds=$(( $(date +%s) - start ))
  times+=("$seconds")
  echo "run $run: exit $status in $seconds s"
  grep -E "^--- make test took|passed|failed" "$clone.log" | tail -4 || true
  if [ "$status" -ne 0 ]; then
    tail -60 "$clone.log"
    exit "$status"
  fi
  rm -rf "$clone"
done
mkdir -p bench/results
printf '{"date": "%s", "commit": "%s", "machine": "%s cores, %s", "load": "stress-ng --cpu 2", "runs_s": [%s]}\n' \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" "$(nproc)" "$(uname -m)" "$(IFS=,; echo "${times[*]}")" \
  > bench/results/ci-under-load.json
echo "all $runs runs green under load: ${times[*]} s (bench/results/ci-under-load.json)"
