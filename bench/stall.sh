#!/usr/bin/env bash
# stall.sh: writer stall, the longest a writer in the sandbox waits while a
# checkpoint runs, under `amlfs exec` (whose command's cgroup the daemon
# freezes while a save reads what changed), for a one-file change on a tree
# of N 4 KiB files in directories of 100, served natively and through FUSE,
# in one run.
#
# In the command, a writer rewrites a 4 KiB file of the tree every
# millisecond and records the longest gap between two of its writes. The
# control is that longest gap over the same time with no checkpoint (the
# machine's own noise); then each of COMMITS checkpoints changes one other
# file and runs `amlfs commit`, and the gap during it is the stall.
# Needs root (cgroup v2, FUSE, native serving); STORE=s3 needs versitygw
# (AMLFS_VERSITYGW).
#
#   N=100000 SERVES="native fuse" STORE=file bash bench/stall.sh
#   LOG_LEVEL=debug also prints each save's hold, from the daemon's log.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
N=${N:-100000}
SERVES=${SERVES:-"native fuse"}
STORE=${STORE:-file}
COMMITS=${COMMITS:-5}
WORK=${BENCH_DIR:-/var/tmp/amlfs-stall}
. bench/common.sh
cleanup() {
  for m in "$WORK"/m-*; do "$AM" unmount --no-save "$m" >/dev/null 2>&1 || true; done
  kill $VPID 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
[ -e /sys/fs/cgroup/cgroup.procs ] || [ -e /sys/fs/cgroup/unified/cgroup.procs ] || { echo "stall.sh: no cgroup v2 hierarchy" >&2; exit 1; }
if [ "$STORE" = s3 ]; then SA=(--store s3://bkt/stall --s3-endpoint "$EP" --s3-path-style); else SA=(--store "file://$WORK/store"); fi
SA+=(--max-entries $((N + N / 100 + 1000)) --max-archive-bytes $((N * 8192 + (64 << 20))))

src="$WORK/src"
make_tree "$src" "$N"
cat > "$WORK/writer.py" <<'PY'
# writer.py FILE OUT: rewrite FILE (4 KiB) every millisecond; at each
# SIGUSR1 append to OUT the longest gap between two writes since the last.
import os, signal, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
buf, longest, last = b"w" * 4096, [0.0], [time.monotonic()]
def report(*_):
    with open(sys.argv[2], "a") as f:
        f.write("%.6f\n" % longest[0])
    longest[0] = 0.0
signal.signal(signal.SIGUSR1, report)
while True:
    os.pwrite(fd, buf, 0)
    now = time.monotonic()
    longest[0] = max(longest[0], now - last[0])
    last[0] = now
    time.sleep(0.001)
PY
ROWS=()
row() { ROWS+=("| $1 | $2 | $3 | $4 |"); echo "| $1 | $2 | $3 | $4 |" >&2; }
for serve in $SERVES; do
  id="stall-$serve"; m="$WORK/m-$id"; out="$WORK/gaps-$serve"; times="$WORK/times-$serve"
  # The workspace: the tree, saved by the first run's exit.
  "$AM" exec "${SA[@]}" --id "$id" --serve "$serve" --cache-dir "$WORK/c-$id" "$m" -- cp -a "$src/." . >/dev/null
  # The measured run, on a fresh cache dir (a lazy restore).
  rm -rf "$WORK/c-$id"
  "$AM" --log-level "${LOG_LEVEL:-info}" exec "${SA[@]}" --id "$id" --serve "$serve" --cache-dir "$WORK/c-$id" --save never "$m" -- sh -c '
    set -e
    AM=$1 M=$2 OUT=$3 TIMES=$4 COMMITS=$5 SERVE=$6 WRITER=$7
    if [ "$SERVE" = native ]; then "$AM" status "$M" | grep -q "^serve: *native" || { echo "not served natively" >&2; exit 1; }
    else findmnt -n -o FSTYPE --mountpoint "$M" | grep -q fuse || { echo "not a FUSE mount" >&2; exit 1; }; fi
    python3 "$WRITER" "$M/d0000/f00" "$OUT" & W=$!
    sleep 1; kill -USR1 $W; sleep 3; kill -USR1 $W   # the control: 3 s, no checkpoint
    for i in $(seq "$COMMITS"); do
      sleep 0.5; kill -USR1 $W; sleep 0.05            # start a window
      echo "change $i" > "$M/d0042/f07"
      t=$(date +%s.%N); "$AM" commit "$M" >/dev/null; echo "$(date +%s.%N) - $t" | bc -l >> "$TIMES"
      sleep 0.05; kill -USR1 $W                          # the commit window
    done
    sleep 0.2; kill $W' _ "$AM" "$m" "$out" "$times" "$COMMITS" "$serve" "$WORK/writer.py" >/dev/null
  python3 - "$out" "$times" "$COMMITS" "$serve" "$N" <<'PY' >> "$WORK/rows"
import sys
gaps = [float(x) for x in open(sys.argv[1])]
times = [float(x) for x in open(sys.argv[2])]
n, serve, files = int(sys.argv[3]), sys.argv[4], sys.argv[5]
# Lines: the warm-up, the control, then per commit a line before it and
# the line of its window.
if len(gaps) != 2 + 2 * n or len(times) != n:
    sys.exit("stall.sh: %d gap reports and %d commit times, want %d and %d" % (len(gaps), len(times), 2 + 2 * n, n))
control, stalls = gaps[1], gaps[3::2]
ms = lambda x: "%.1f" % (x * 1000)
print("%s|writer's longest gap with no checkpoint (control, 3 s)|%s|-" % (serve, ms(control)))
print("%s|writer stall during a one-file checkpoint: worst of %d|%s|%s" % (serve, n, ms(max(stalls)), "<= 100 ms" if serve == "native" else "reported"))
print("%s|the same, median|%s|-" % (serve, ms(sorted(stalls)[n // 2])))
print("%s|commit's own time, median|%s|-" % (serve, ms(sorted(times)[n // 2])))
PY
done
# LOG_LEVEL=debug: how long each save held the writers, and what it read.
[ "${LOG_LEVEL:-info}" = debug ] && grep -h "writers held" "$WORK"/run/*.log >&2
printf '\nstall: %s files of 4 KiB, %s store, kernel %s, %s cores\n\n' "$N" "$STORE" "$(uname -r)" "$(nproc)"
printf '| serving | measure | ms | target |\n|---|---|---|---|\n'
while IFS='|' read -r s what v tgt; do printf '| %s | %s | %s | %s |\n' "$s" "$what" "$v" "$tgt"; done < "$WORK/rows"
