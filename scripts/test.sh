#!/usr/bin/env bash
# The whole test suite: the README's second set-up command, and what .ci/run runs.
#
# 1. Builds every test, example and bench of the workspace once (release).
# 2. Asks this host's kernel what it allows (`doctor`). Where it runs BPF arenas, every test runs
#    here (`cargo test --release --workspace`). Where it refuses them (a policy, or a kernel
#    before 6.9), it says so in one line and runs here only the tests that need no BPF; the BPF
#    tests then run in VMs, never reported as passed on a host that cannot run them.
# 3. Runs the smoke suite (scripts/smoke.sh: every program loaded alone, a tiny model's logits
#    against the twin per operator and in the plan, generation and sampling in the kernel, the
#    tokenizer against the `tokenizers` crate on every kernel; serve install/ask/remove, the
#    filter, the CLI and the network tests each on one) on every kernel of scripts/kernels.txt in
#    qemu (scripts/vm-test.sh).
#
# QWEN_BPF_KERNELS="6.12 7.3" picks kernels of the matrix; QWEN_BPF_KERNELS=none skips the VMs.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --release --workspace --no-run

# The tests that need no BPF (the pure-Rust layers, the f32 reference, the tokenizer crate,
# candle and proptest): they run on any host.
pure=(
  cargo test --release --no-fail-fast --workspace --lib
  --test api_docs --test checkpoint --test filter_rule --test layers --test file_map --test reference
  --test swar_accuracy --test tokenizer --test candle_peer --test filter_model --test fuzz
  --test pin_dirs
)

status=0
./target/release/qwen-bpf doctor >target/doctor-host.txt 2>&1 || true
if grep -q '^  programs and arena *yes' target/doctor-host.txt; then
  echo "test: this host runs BPF arenas: every test runs here" >&2
  cargo test --release --no-fail-fast --workspace || status=1
else
  cause="$(grep '^  programs and arena' target/doctor-host.txt | sed 's/^  programs and arena *NO: //')"
  echo "test: this host cannot run the BPF tests (${cause:-see target/doctor-host.txt}); here only the tests that need no BPF, and the BPF smoke suite in VMs" >&2
  "${pure[@]}" || status=1
  # tests/cli.rs: its `kernel_` test needs arenas and is in the VMs' smoke suite
  echo "test: tests/cli.rs here without its kernel_ test, which the VMs run" >&2
  cargo test --release --test cli -- --skip kernel_ || status=1
  cargo test --release -p qwen_bpf --doc || status=1
  # the memory layer on array maps runs here natively (issue 35: the programs move onto it)
  echo "test: the array memory layer's tests here, natively; the arena layer's in the VMs" >&2
  cargo test --release --test memory_layer -- array auto_ || status=1
  cargo test --release --test ops_twins --test swar_twins --test batch_twins --test screen \
    --test kv8_twins --test array_model --test limits --test sample_kernel --test tokenize_kernel \
    --test smoke --test in_kernel -- array_ || status=1
fi
summary=("host: $([ $status -eq 0 ] && echo passed || echo FAILED)")

matrix_names="$(awk '!/^[[:space:]]*(#|$)/ {print $1}' scripts/kernels.txt | xargs)"
kernels="${QWEN_BPF_KERNELS:-$matrix_names}"
[ "$kernels" = none ] && { echo "test: QWEN_BPF_KERNELS=none: no VM" >&2; exit $status; }
# every heavy test of smoke.txt is pinned to one kernel: that kernel must be in the matrix, or the
# test would never run anywhere
for only in $(awk '!/^[[:space:]]*(#|$)/ && NF >= 3 && $3 != "array" {print $3}' scripts/smoke.txt | sort -u); do
  [[ " $matrix_names " == *" $only "* ]] || { echo "test: scripts/smoke.txt pins tests to kernel $only, which is not in scripts/kernels.txt" >&2; status=1; summary+=("smoke.txt: kernel $only not in the matrix: FAILED"); }
done
for k in $kernels; do
  start=$(date +%s)
  # 125: the VM never ran the command to its end (a boot or an emulator that died), not a test
  # that failed: that, and only that, is tried once more
  rc=0; scripts/vm-test.sh "$k" -- scripts/smoke.sh || rc=$?
  if [ $rc -eq 125 ]; then
    echo "test: kernel $k: the VM did not finish; trying it once more" >&2
    rc=0; scripts/vm-test.sh "$k" -- scripts/smoke.sh || rc=$?
  fi
  if [ $rc -eq 0 ]; then r=passed; else r="FAILED (exit $rc)"; status=1; fi
  summary+=("kernel $k: smoke suite $r ($(( $(date +%s) - start )) s)")
done
printf 'test: %s\n' "${summary[@]}"
ok=$(printf '%s\n' "${summary[@]}" | grep -c passed || true)
echo "suites: $ok passed, $(( ${#summary[@]} - ok )) failed"
exit $status
