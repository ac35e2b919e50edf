#!/usr/bin/env bash
# Runs a command inside a Debian kernel booted with qemu and virtme-ng, sharing this machine's root
# file system read-write (the checkout, its target/ and ../shared included; the VM's /tmp is its own).
#
#   scripts/vm-test.sh NAME -- COMMAND [ARG...]    NAME: a line of scripts/kernels.txt (6.12, 6.18,
#                                                 7.3), `all` for every line, or `host` (no VM)
#   scripts/vm-test.sh --list                     the matrix
#
# The kernel package is fetched once with `apt-get download` from Debian's archive (a private apt
# configuration under $QWEN_BPF_VM_CACHE, /var/cache/qwen-bpf-vm by default: the host's sources
# are not touched), unpacked with `dpkg -x`, its image copied to /boot/vmlinuz-VERSION and its
# modules to /lib/modules/VERSION. Needs root. KVM is used when /dev/kvm boots; otherwise (nested
# virtualisation refuses it on these machines) TCG: correct, but slow, so timings taken inside the
# VM are not performance figures. COMMAND's output is streamed; the script exits with its status
# (or 125 when the VM never ran it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
list="$here/kernels.txt"
cache="${QWEN_BPF_VM_CACHE:-/var/cache/qwen-bpf-vm}"
memory="${QWEN_BPF_VM_MEMORY:-6G}"

die() { echo "vm-test: $*" >&2; exit 125; }
matrix() { grep -v '^\s*\(#\|$\)' "$list"; }

[ "${1:-}" = "--list" ] && { matrix; exit 0; }
[ $# -ge 3 ] && [ "$2" = "--" ] || die "usage: $0 NAME|all|host -- COMMAND [ARG...] (names: $(matrix | awk '{print $1}' | xargs))"
name="$1"; shift 2

if [ "$name" = "all" ]; then
  status=0
  for n in $(matrix | awk '{print $1}'); do
    echo "vm-test: ==== kernel $n ====" >&2
    "$0" "$n" -- "$@" || status=$?
  done
  exit $status
fi
if [ "$name" = "host" ]; then exec "$@"; fi

line="$(matrix | awk -v n="$name" '$1 == n')"
[ -n "$line" ] || die "no kernel named '$name' in $list (names: $(matrix | awk '{print $1}' | xargs))"
read -r _ suite pkg <<<"$line"
[ "$(id -u)" -eq 0 ] || die "needs root (it installs the kernel under /boot and /lib/modules)"

# --- tools: qemu, kmod and busybox from apt (before any other suite is mentioned), vng from PyPI
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v depmod >/dev/null || need+=(kmod)
[ -x /bin/busybox ] || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
  echo "vm-test: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v vng >/dev/null; then
  echo "vm-test: installing virtme-ng (pip)" >&2
  python3 -m pip --version >/dev/null 2>&1 || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null
  }
  python3 -m pip install -q virtme-ng 2>/dev/null || python3 -m pip install -q --break-system-packages virtme-ng
  hash -r
fi
command -v vng >/dev/null || die "vng (virtme-ng) is not on the PATH after installing it"

# --- the kernel: VERSION from the package name (linux-image-V or linux-binary-V)
version="${pkg#linux-image-}"; version="${version#linux-binary-}"
if [ ! -f "/boot/vmlinuz-$version" ] || [ ! -f "/lib/modules/$version/modules.dep" ]; then
  (
    flock 9
    apt_dir="$cache/apt"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$cache/debs" "$cache/root"
    cat >"$apt_dir/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
EOF
    opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir" -o APT::Architecture=amd64
          -o APT::Sandbox::User=root)
    pkgs=("$pkg")
    case "$pkg" in linux-binary-*) pkgs+=("linux-modules-$version") ;; esac
    cd "$cache/debs"
    if ! ls "${pkgs[0]}"_*.deb >/dev/null 2>&1 || { [ ${#pkgs[@]} -gt 1 ] && ! ls "${pkgs[1]}"_*.deb >/dev/null 2>&1; }; then
      echo "vm-test: fetching ${pkgs[*]} ($suite)" >&2
      apt-get "${opts[@]}" update -qq
      apt-get "${opts[@]}" download "${pkgs[@]}" >/dev/null
    fi
    for p in "${pkgs[@]}"; do dpkg -x "$(ls "$p"_*.deb | head -1)" "$cache/root"; done
    img=""
    for c in "$cache/root/boot/vmlinuz-$version" "$cache/root/usr/lib/modules/$version/vmlinuz"; do
      [ -f "$c" ] && img="$c" && break
    done
    [ -n "$img" ] || { echo "vm-test: no kernel image in $pkg" >&2; exit 1; }
    cp "$img" "/boot/vmlinuz-$version"
    for m in "$cache/root/lib/modules/$version" "$cache/root/usr/lib/modules/$version"; do
      [ -d "$m/kernel" ] && { mkdir -p "/lib/modules/$version"; cp -a "$m/." "/lib/modules/$version/"; }
    done
    rm -f "/lib/modules/$version/vmlinuz"
    depmod "$version" 2>/dev/null
  ) 9>"$cache.lock" || die "could not install kernel $pkg"
fi

# --- the run: the command's status and output go through a shared directory (the VM's console
# carries the boot log only)
# A directory the guest writes through to the host: not under /tmp (the guest overlays it, so the
# host never sees its writes), /var/tmp, /var/cache or /run (the guest's own tmpfs).
runs="${QWEN_BPF_VM_RUNS:-/var/lib/qwen-bpf-vm/runs}"
work="$(mkdir -p "$runs" && mktemp -d "$runs/run.XXXXXX")"
trap 'kill "$tailer" 2>/dev/null || true; rm -rf "$work"' EXIT
printf '%q ' "$@" >"$work/cmd"
cat >"$work/run.sh" <<EOF
#!/bin/bash
cd $(printf '%q' "$PWD")
export PATH=$(printf '%q' "$PATH") HOME=$(printf '%q' "${HOME:-/root}") QWEN_BPF_VM=$(printf '%q' "$name")
touch $(printf '%q' "$work/started")
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
ip link set lo up 2>/dev/null || true
bash $(printf '%q' "$work/cmd") >$(printf '%q' "$work/out") 2>&1
echo \$? >$(printf '%q' "$work/rc")
EOF
chmod +x "$work/run.sh"
touch "$work/out"
tail -n +1 -f "$work/out" &
tailer=$!

boot() { # $@: extra vng flags
  vng --run "$version" --rw --cpus "$(nproc)" --memory "$memory" "$@" \
    --verbose --exec "$work/run.sh" >"$work/console" 2>&1 || true
}
# KVM, when it boots at all, is asked once per host boot and kernel (a guest that hangs under
# nested virtualisation is cut off after 60 s); the answer is kept in the cache.
accel="tcg"
if [ -e /dev/kvm ] && [ -z "${QWEN_BPF_VM_TCG:-}" ]; then
  mark="$cache/kvm-$(cat /proc/sys/kernel/random/boot_id)-$version"
  if [ ! -f "$mark" ]; then
    timeout 60 vng --run "$version" --memory 1G --exec "touch $work/kvm-ok" >/dev/null 2>&1 || true
    if [ -f "$work/kvm-ok" ]; then echo yes >"$mark"; else echo no >"$mark"; fi
  fi
  [ "$(cat "$mark")" = yes ] && accel="kvm"
fi
# A guest that dies before it starts the command (under TCG an early-boot panic happens now and
# then: seen once in sched_clock_cpu on 7.3.4) is booted again, up to three times in all.
for attempt in 1 2 3; do
  if [ "$accel" = kvm ]; then boot; else boot --disable-kvm; fi
  [ -f "$work/started" ] && break
  echo "vm-test: the guest ($version) died before the command started (boot $attempt of 3); its console's end:" >&2
  tail -n 8 "$work/console" >&2
done
sleep 0.3
kill "$tailer" 2>/dev/null || true
if [ ! -f "$work/rc" ]; then
  echo "vm-test: the VM ($version, $accel) never finished the command; its console's last lines:" >&2
  tail -n 40 "$work/console" >&2
  cp "$work/console" "$runs/last-failed-console.txt" 2>/dev/null || true
  exit 125
fi
rc="$(cat "$work/rc")"
echo "vm-test: kernel $version ($accel): exit $rc" >&2
exit "$rc"
