#!/usr/bin/env bash
# Runs every ctest suite of the normal build, then of the sanitizer build, then
# the tests labelled tsan (the store's threaded tests, the UCX data plane's test_xfer and
# test_xproc_chaos) in a ThreadSanitizer
# build that it configures and builds itself when needed (only their targets,
# kvs_tsan_tests: CI stays short; KVS_SKIP_TSAN=1 leaves it out), prints each CUnit binary's Run
# Summary, and ends with ctest's closing lines.
# Exit status: non-zero when any test failed in any build.
set -uo pipefail
build=${1:-build}
asan=${2:-build-asan}
tsan=${3:-build-tsan}
jobs=$(nproc 2>/dev/null || echo 2)
# LeakSanitizer needs ptrace-like access that some containers deny; fail loudly, not silently.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

status=0
summaries=()
total=0
failed=0
dirs=("$build" "$asan")
if [ "${KVS_SKIP_TSAN:-0}" != 1 ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  echo "=== building $tsan (ThreadSanitizer, the tests labelled tsan) ==="
  if cmake -S "$root" -B "$tsan" -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=thread -DKVS_CUDA=OFF \
       -DKVS_BUILD_BENCH=OFF >/dev/null &&
     cmake --build "$tsan" -j "$jobs" --target kvs_tsan_tests; then
    dirs+=("$tsan")
  else
    echo "run-all: the ThreadSanitizer build failed"
    summaries+=("$tsan: build failed")
    status=1
  fi
fi
for dir in "${dirs[@]}"; do
  echo "=== ctest in $dir ==="
  log=$(mktemp)
  label=()
  [ "$dir" = "$tsan" ] && label=(-L tsan)
  (cd "$dir" && ctest "${label[@]}" --output-on-failure -j "$jobs" --timeout 600) 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$log" | tail -n 1)
  summaries+=("$dir: ${line:-no ctest summary (ctest exit $rc)}")
  if [[ $line =~ ([0-9]+)\ tests\ failed\ out\ of\ ([0-9]+) ]]; then
    failed=$((failed + BASH_REMATCH[1]))
    total=$((total + BASH_REMATCH[2]))
  else
    status=1
  fi
  rm -f "$log"
done

echo
echo "=== CUnit run summaries ==="
for dir in "${dirs[@]}"; do
  last="$dir/Testing/Temporary/LastTest.log"
  [ -f "$last" ] || continue
  awk -v d="$dir" '
    /^[0-9]+\/[0-9]+ Testing: / { name = $3 }
    /Run Summary:/ { insum = 1; printf "%s %s\n", d, name; next }
    insum && /^ +(suites|tests|asserts)/ { print "   " $0; next }
    insum && /Elapsed time/ { insum = 0 }
  ' "$last"
done

echo
for s in "${summaries[@]}"; do echo "$s"; done
# One closing line over all builds, in ctest's own words.
pct=0
[ "$total" -gt 0 ] && pct=$(( (total - failed) * 100 / total ))
echo "${pct}% tests passed, ${failed} tests failed out of ${total}"
exit $status
