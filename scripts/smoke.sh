#!/usr/bin/env bash
# The smoke suite on the running kernel (scripts/vm-test.sh runs it inside each VM): doctor's
# report of every program (loaded alone, with the verifier's instruction count), then each test
# of scripts/smoke.txt from the test binaries already built (`cargo test --release --no-run`).
# Prints one line per test and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
kernel="$(uname -r)"
echo "smoke: kernel $kernel"
./target/release/qwen-bpf doctor --programs -v
doctor=$?
pass=0 fail=0 failed=()
while read -r target name only; do
  case "$target" in ''|'#'*) continue ;; esac
  # a third field names the one kernel (a prefix of `uname -r`) the test runs on
  if [ -n "${only:-}" ] && [[ "$kernel" != "$only"* ]]; then
    echo "smoke: on $only only: $target::$name"; continue
  fi
  bin="$(ls -t target/release/deps/"$target"-* 2>/dev/null | grep -v '\.d$' | head -1)"
  if [ -z "$bin" ]; then echo "smoke: no test binary for $target (build with cargo test --release --no-run)"; fail=$((fail+1)); failed+=("$target::$name"); continue; fi
  start=$(date +%s)
  if "$bin" --exact "$name" --test-threads 1 > "target/smoke-$target-$name.log" 2>&1 && grep -q "1 passed" "target/smoke-$target-$name.log"; then
    echo "smoke: ok    $target::$name ($(( $(date +%s) - start )) s)"; pass=$((pass+1))
  else
    echo "smoke: FAIL  $target::$name ($(( $(date +%s) - start )) s); its output:"; tail -n 40 "target/smoke-$target-$name.log" | sed 's/^/    /'
    fail=$((fail+1)); failed+=("$target::$name")
  fi
done < scripts/smoke.txt
[ $doctor -eq 0 ] || { echo "smoke: doctor found a facility missing or a program refused"; fail=$((fail+1)); }
echo "smoke: kernel $kernel done"
echo "smoke: $pass passed, $fail failed"
[ $fail -eq 0 ]
