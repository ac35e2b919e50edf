#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build qwen_bpf: clang-19 and llvm-19 (BPF
# target), libelf and zlib (vendored libbpf), pkg-config and make. Idempotent; quiet when all is there.
set -euo pipefail
need=()
for p in clang-19 llvm-19 libelf-dev zlib1g-dev pkg-config make; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then echo "setup: missing ${need[*]}; run as root to install them" >&2; exit 1; fi
echo "setup: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
