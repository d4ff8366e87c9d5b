#!/usr/bin/env bash
# fsbench.sh: the same workload on a native directory, the go-fuse loopback
# example, an amlfs workspace served through FUSE (--serve fuse, the
# fallback) and one served as amlfs serves by default (--serve auto:
# natively, a bind mount, where that can run), side by side in one run, reported as
# ratios to native. A second plain directory on the same disk (control) is
# timed the same way: its ratio is the machine's noise, what two identical
# targets differ by in the run. Needs root (FUSE, bind mounts, drop_caches).
#
#   bash bench/fsbench.sh [SIZE_MIB]      (default 1024)
set -euo pipefail
shopt -s inherit_errexit  # a step that fails inside $(...) stops the run too
cd "$(dirname "$0")/.."
SIZE_MIB=${1:-1024}
WORK=${BENCH_DIR:-/var/tmp/amlfs-bench}
GOSRC=${GOSRC:-$(go env GOROOT)/src}

rm -rf "$WORK"; mkdir -p "$WORK"/{native,ctl,lb-backing,lb,am,amn,bin,store,cache,run}
export AMLFS_RUNTIME_DIR="$WORK/run"
go build -o "$WORK/bin/amlfs" ./cmd/amlfs
GOBIN="$WORK/bin" go install github.com/hanwen/go-fuse/v2/example/loopback@v2.12.1
tar -C "$(dirname "$GOSRC")" -cf "$WORK/src.tar" "$(basename "$GOSRC")"
NFILES=$(tar -tf "$WORK/src.tar" | wc -l)

cleanup() {
  "$WORK/bin/amlfs" unmount --no-save "$WORK/am" >/dev/null 2>&1 || true
  "$WORK/bin/amlfs" unmount --no-save "$WORK/amn" >/dev/null 2>&1 || true
  umount "$WORK/lb" 2>/dev/null || true
  kill "${LBPID:-0}" 2>/dev/null || true
}
trap cleanup EXIT

"$WORK/bin/loopback" "$WORK/lb" "$WORK/lb-backing" >/dev/null 2>&1 &
LBPID=$!
"$WORK/bin/amlfs" mount --daemon "$WORK/am" --store "file://$WORK/store" --id bench --cache-dir "$WORK/cache" --save never --serve fuse >/dev/null
"$WORK/bin/amlfs" mount --daemon "$WORK/amn" --store "file://$WORK/store" --id bench-native --cache-dir "$WORK/cache" --save never >/dev/null
. bench/mounted.sh
mounted "$WORK/lb" "the go-fuse loopback example"
mounted "$WORK/am" "amlfs"
DEFAULT=$(serving "$WORK/amn" "amlfs (default serving)" "$WORK/bin/amlfs")

# drop: cold caches, and a disk at rest. Dropping the caches makes the
# kernel forget a FUSE target's inodes, and only then does its daemon
# close the descriptors of the files the last rm -rf removed, which frees
# them: 12.8k inodes and their blocks freed while the next target untars
# made that untar up to 4x slower. They are freed before the next step.
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; sync; }
# t CMD...: run CMD, its seconds in T. A step that fails stops the run, with
# its error: a failed step must never be recorded as a short time.
t() {
  local s e; s=$(date +%s.%N)
  if ! "$@" >/dev/null 2>"$WORK/step.err"; then
    echo "fsbench: step failed ($target): $*" >&2; cat "$WORK/step.err" >&2; exit 1
  fi
  e=$(date +%s.%N); T=$(echo "$e - $s" | bc -l)
}

declare -A R
STEPS="write read-cold read-warm untar find ls-lR grep-r git-status rm-rf"
ROUNDS=${ROUNDS:-2}
# keep NAME SECONDS: remember the best (lowest) time of the rounds.
keep() { local cur=${R[$1]:-}; if [ -z "$cur" ] || (( $(echo "$2 < $cur" | bc -l) )); then R[$1]=$2; fi; }
TARGETS=(native ctl lb am amn)
for round in $(seq "$ROUNDS"); do
  # Rotate the order each round so no target always runs first.
  order=""
  for i in "${!TARGETS[@]}"; do order+=" ${TARGETS[$(( (i + round - 1) % ${#TARGETS[@]} ))]}"; done
  for target in $order; do
    d="$WORK/$target"
    drop
    t dd if=/dev/zero of="$d/big" bs=1M count="$SIZE_MIB" conv=fsync; keep "$target,write" "$T"
    drop
    t dd if="$d/big" of=/dev/null bs=1M; keep "$target,read-cold" "$T"
    t dd if="$d/big" of=/dev/null bs=1M; keep "$target,read-warm" "$T"
    rm -f "$d/big"
    drop
    t tar -C "$d" -xf "$WORK/src.tar"; keep "$target,untar" "$T"
    drop
    t find "$d" -name '*.go'; keep "$target,find" "$T"
    t ls -lR "$d"; keep "$target,ls-lR" "$T"
    t grep -r -l 'func main' "$d"; keep "$target,grep-r" "$T"
    # A warm `git status` of the tree (a repository made untimed, with
    # its objects packed and no background auto-gc, which would run
    # during the timed status; the first status primes the caches): what
    # an agent runs at every step.
    t sh -c "cd '$d/src' && git init -q && git config gc.auto 0 && git config maintenance.auto false && git add -A && git -c user.name=b -c user.email=b@b commit -qm t && git gc -q && git status --porcelain"
    t git -C "$d/src" status --porcelain; keep "$target,git-status" "$T"
    t rm -rf "$d/src"; keep "$target,rm-rf" "$T"
  done
done

printf '\nfsbench: %d MiB sequential, %d-entry source tree (%s), kernel %s, best of %d rounds\n\n' "$SIZE_MIB" "$NFILES" "$GOSRC" "$(uname -r)" "$ROUNDS"
printf 'amlfs default: served %s here\n\n' "$DEFAULT"
printf '| step | native s | control s | loopback s | amlfs fuse s | amlfs default s | control / native | loopback / native | amlfs fuse / native | amlfs default / native |\n|---|---|---|---|---|---|---|---|---|---|\n'
for s in $STEPS; do
  n=${R[native,$s]}; c=${R[ctl,$s]}; l=${R[lb,$s]}; a=${R[am,$s]}; an=${R[amn,$s]}
  printf '| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.2fx | %.2fx | %.2fx | %.2fx |\n' "$s" "$n" "$c" "$l" "$a" "$an" "$(echo "$c / $n" | bc -l)" "$(echo "$l / $n" | bc -l)" "$(echo "$a / $n" | bc -l)" "$(echo "$an / $n" | bc -l)"
done
