#!/usr/bin/env bash
# The smoke suite on the running kernel (scripts/vm-test.sh runs it inside each VM): doctor's
# report of every program of each memory layer the kernel gives (loaded alone, with the
# verifier's instruction count), then each test
# of scripts/smoke.txt from the test binaries already built (`cargo test --release --no-run`).
# Prints one line per test and exits non-zero if any failed. On a kernel without arenas (Linux
# before 6.9) only the array layer's tests run; the others are listed as not run.
set -uo pipefail
cd "$(dirname "$0")/.."
kernel="$(uname -r)"
echo "smoke: kernel $kernel"
./target/release/qwen-bpf doctor --programs -v | tee target/smoke-doctor.txt
doctor=${PIPESTATUS[0]}
# doctor's refusals ("LAYER PROGRAM"), and those scripts/known-refusals.txt does not list for
# this kernel
refusals="$(awk '/^programs on the (arena|array) layer/ {layer=$4} / REFUSED: / {print layer, $2}' target/smoke-doctor.txt)"
unknown=""
while read -r layer prog; do
  [ -n "$layer" ] || continue
  if awk -v k="$kernel" -v l="$layer" -v p="$prog" '!/^[[:space:]]*(#|$)/ && $2 == l && $3 == p && (index(k, $1 ".") == 1 || index(k, $1 "-") == 1) {f=1} END {exit !f}' scripts/known-refusals.txt; then
    echo "smoke: known refusal on this kernel (scripts/known-refusals.txt): $layer layer, $prog"
  else
    unknown="$unknown $layer:$prog"
  fi
done <<< "$refusals"
# A kernel without arenas (before 6.9) runs the tests marked `array` only: every other test needs
# the arena, and is listed as not run, with the cause, instead of failing on it.
arena=yes
# (only a kernel that lacks them: an arena refused on a kernel that has them fails the suite)
if grep -q '^  programs and arena *NO: .*lacks BPF arena maps' target/smoke-doctor.txt; then
  arena=no
  cause="$(grep '^  programs and arena' target/smoke-doctor.txt | sed 's/^  programs and arena *NO: //')"
  echo "smoke: no arena here ($cause): the array layer's tests only"
fi
pass=0 fail=0 skipped=0 failed=()
while read -r target name only; do
  case "$target" in ''|'#'*) continue ;; esac
  # a third field: `array` (the test runs on the array layer, on every kernel), or the one
  # kernel the test runs on (its matrix name: `uname -r` is it and more, after a dot or dash)
  if [ "${only:-}" = array ]; then
    :
  elif [ -n "${only:-}" ]; then
    # the named kernel runs it, with or without arenas (a test for a kernel without them uses
    # the array layer)
    [[ "$kernel" == "$only".* || "$kernel" == "$only"-* ]] || { echo "smoke: on $only only: $target::$name"; continue; }
  elif [ $arena = no ]; then
    echo "smoke: not run, needs an arena: $target::$name"; skipped=$((skipped+1)); continue
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
if [ $arena = no ]; then
  # what such a kernel must still do: the array layer, as doctor's memory line reports it
  grep -q '^  memory layers *yes' target/smoke-doctor.txt || { echo "smoke: doctor: the array memory layer does not run"; fail=$((fail+1)); }
  # and the verifier takes every program of the array build
  grep -q '^programs on the array layer (each' target/smoke-doctor.txt || { echo "smoke: doctor loaded no array-layer program"; fail=$((fail+1)); }
  [ -z "$unknown" ] || { echo "smoke: doctor: the verifier refused an array-layer program:$unknown"; fail=$((fail+1)); }
elif [ $doctor -ne 0 ] && { [ -n "$unknown" ] || [ -z "$refusals" ]; }; then
  echo "smoke: doctor found a facility missing or a program refused${unknown:+:$unknown}"; fail=$((fail+1))
fi
echo "smoke: kernel $kernel done"
echo "smoke: $pass passed, $fail failed$([ $arena = no ] && echo ", $skipped not run (no arena on this kernel)")"
[ $fail -eq 0 ]
