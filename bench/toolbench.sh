#!/usr/bin/env bash
# toolbench.sh: file-tool calls (read_file, stat, list_files, write_file of
# small files, through the control socket, as an agent's tool layer makes
# them) against an amlfs workspace served natively (the tree itself: no
# daemon between the call and the disk), a second one served natively
# (control: the machine's noise), and one served through FUSE, side by
# side in one run, as the median time per call and its ratio to native.
# Needs root (FUSE, native serving).
#
#   ROUNDS=3 N=2000 bash bench/toolbench.sh
#   AMLFS_BIN=/path/to/amlfs ...   (time another build)
set -euo pipefail
shopt -s inherit_errexit  # a step that fails inside $(...) stops the run too
cd "$(dirname "$0")/.."
WORK=${BENCH_DIR:-/var/tmp/amlfs-toolbench}
ROUNDS=${ROUNDS:-3}
N=${N:-2000}
rm -rf "$WORK"; mkdir -p "$WORK"/{native,ctl,fuse,bin,store,cache,run}
export AMLFS_RUNTIME_DIR="$WORK/run"
if [ -n "${AMLFS_BIN:-}" ]; then cp "$AMLFS_BIN" "$WORK/bin/amlfs"; else go build -o "$WORK/bin/amlfs" ./cmd/amlfs; fi
go build -o "$WORK/bin/toolcalls" ./bench/toolcalls
AM="$WORK/bin/amlfs"
cleanup() { for t in native ctl fuse; do "$AM" unmount --no-save "$WORK/$t" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
"$AM" mount --daemon "$WORK/native" --store "file://$WORK/store" --id tb-native --cache-dir "$WORK/cache" --save never --serve native >/dev/null
"$AM" mount --daemon "$WORK/ctl" --store "file://$WORK/store" --id tb-ctl --cache-dir "$WORK/cache" --save never --serve native >/dev/null
"$AM" mount --daemon "$WORK/fuse" --store "file://$WORK/store" --id tb-fuse --cache-dir "$WORK/cache" --save never --serve fuse >/dev/null
. bench/mounted.sh
mounted_native "$WORK/native" "amlfs --serve native" "$AM"
mounted_native "$WORK/ctl" "amlfs --serve native (control)" "$AM"
mounted "$WORK/fuse" "amlfs --serve fuse"

declare -A R
TOOLS="read_file file_stat list_files write_file"
TARGETS=(native ctl fuse)
keep() { local cur=${R[$1]:-}; if [ -z "$cur" ] || (( $(echo "$2 < $cur" | bc -l) )); then R[$1]=$2; fi; }
for round in $(seq "$ROUNDS"); do
  order=""
  for i in "${!TARGETS[@]}"; do order+=" ${TARGETS[$(( (i + round - 1) % ${#TARGETS[@]} ))]}"; done
  for target in $order; do
    out=$("$WORK/bin/toolcalls" -n "$N" "$WORK/$target")  # set -e: a failed call stops the run
    while read -r tool us; do keep "$target,$tool" "$us"; done <<<"$out"
  done
done

printf '\ntoolbench: %d calls per tool, kernel %s, best median of %d rounds\n\n' "$N" "$(uname -r)" "$ROUNDS"
printf '| tool | native µs | control µs | fuse µs | control / native | fuse / native |\n|---|---|---|---|---|---|\n'
for t in $TOOLS; do
  n=${R[native,$t]}; c=${R[ctl,$t]}; f=${R[fuse,$t]}
  printf '| %s | %.0f | %.0f | %.0f | %.2fx | %.2fx |\n' "$t" "$n" "$c" "$f" "$(echo "$c / $n" | bc -l)" "$(echo "$f / $n" | bc -l)"
done
