#!/usr/bin/env bash
# checkpoint.sh: what a checkpoint costs, per step, in time and in store
# requests (counted by operation from versitygw's --access-log), for
# trees of 4 KiB files in directories of 100, in one run:
#   first save, a save after changing one file, a save with no change,
#   a fork's first save (commit --fork), the prune of one revision
#   (after publication, in the background: its requests only), a lazy
#   mount-ready on a fresh cache dir, a one-file save on that lazy mount
#   (every other file still a placeholder), reading 2,000 files after it,
#   and a full restore.
# Every combination of SIZES, FORMATS (archive folder), STORES (s3 file)
# and SERVES (fuse native), but trees over 30,000 files only in
# FORMATS_LARGE (default archive: a folder of 100k files costs minutes a
# step, as issue 28 measured); each mount's --max-entries is raised for the
# tree (n files and n/100 directories). The references, in the same run: `tar -czf`
# of the tree (first save), `tar -x` of the same tree of empty files on a
# new ext4 (a native lazy mount makes every placeholder up front; it runs
# on a new ext4 of its own too), and on S3
# `rclone sync` of the tree and of a one-file change.
# Needs root (FUSE, native serving) and versitygw (AMLFS_VERSITYGW);
# installs awscli and rclone from Debian if missing.
#
#   SIZES="10000" FORMATS=archive STORES=s3 SERVES=fuse bash bench/checkpoint.sh
#   RCLONE=0 leaves rclone's reference out.
set -euo pipefail
shopt -s inherit_errexit  # a step that fails inside $(...) stops the run too
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"10000 100000"}
FORMATS=${FORMATS:-"archive folder"}
FORMATS_LARGE=${FORMATS_LARGE:-archive}
STORES=${STORES:-"s3 file"}
SERVES=${SERVES:-"fuse native"}
WORK=${BENCH_DIR:-/var/tmp/amlfs-checkpoint}
. bench/common.sh
[ -x /usr/bin/rclone ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rclone >/dev/null
cleanup() {
  for m in "$WORK"/m*; do "$AM" unmount --no-save "$m" >/dev/null 2>&1 || true; done
  umount_fs 2>/dev/null || true
  kill $VPID 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
sleep 1
settle() { sync; sleep 1; }
# umount_fs: unmount $WORK/fs once nothing uses it: an unmount without a
# save leaves its tree to a remover process of its own, which may still be
# deleting it there (up to 2 minutes).
umount_fs() {
  mountpoint -q "$WORK/fs" || return 0
  for _ in $(seq 240); do umount "$WORK/fs" 2>/dev/null && return 0; sleep 0.5; done
  umount "$WORK/fs"
}
# fresh_fs: a new, empty ext4 (an 8 GiB sparse image on a loop device) at
# $WORK/fs, for the native lazy mount and its tar -x floor.
fresh_fs() {
  umount_fs
  rm -f "$WORK/fs.img"; truncate -s 8G "$WORK/fs.img"
  mkfs.ext4 -q -F "$WORK/fs.img"; mkdir -p "$WORK/fs"; mount -o loop "$WORK/fs.img" "$WORK/fs"
}
ready() { # ready DIR SERVE: the mount is there, or the run stops
  if [ "$2" = native ]; then mounted_native "$1" "amlfs native" "$AM"; else mounted "$1" amlfs; fi
}
ROWS=()
# waits DIR: the daemon's S3 wait so far, all requests and server copies.
waits() {
  "$AM" status --json "$1" | python3 -c 'import json,sys; m=json.load(sys.stdin).get("metrics",{}); print(m.get("amlfs_s3_wait_seconds_total{ops=\"all\"}",0), m.get("amlfs_s3_wait_seconds_total{ops=\"server_copy\"}",0))'
}
# split_wait DIR: after a step, on S3, the step's time split apart (W0:
# waits before it): the wall-clock time with an S3 request in flight (the
# union of their intervals, from the daemon's amlfs_s3_wait_seconds_total),
# of it the server's own copies (UploadPartCopy, CompleteMultipartUpload,
# CopyObject), and the rest, amlfs's own.
split_wait() {
  [ "$store" = s3 ] || return 0
  local all copy
  read -r all copy <<<"$(python3 -c 'import sys; a=sys.argv[1].split(); b=sys.argv[2].split(); print(float(b[0])-float(a[0]), float(b[1])-float(a[1]))' "$W0" "$(waits "$1")")"
  row "$tag" "of it, waiting for S3 (any request in flight)" "$(printf '%.2f' "$all")" - -
  row "$tag" "of that, the server's ranged copies and completion" "$(printf '%.2f' "$copy")" - -
  row "$tag" "of it, amlfs's own time (save less waiting for S3)" "$(printf '%.2f' "$(python3 -c "print(max(0, $LAST - $all))")")" - "<= 1 s"
}
# row: one line of the table, also printed as it comes (a run that stops
# half way keeps what it measured).
row() { ROWS+=("| $1 | $2 | $3 | $4 | $5 |"); echo "| $1 | $2 | $3 | $4 | $5 |" >&2; }

for n in $SIZES; do
  src="$WORK/src$n"
  make_tree "$src" "$n"
  settle; t=$(now); tar -czf "$WORK/ref.tgz" -C "$src" .; TARC=$(since $t)
  row "$n files" "reference: tar -czf of the tree" "$TARC" - -
  find "$src" -type f -printf '%P\n' > "$WORK/list"
  # The same tree of empty files, as a native lazy mount makes it.
  rm -rf "$WORK/emptysrc"
  python3 - "$src" "$WORK/emptysrc" <<'PY'
import os, sys
src, dst = sys.argv[1], sys.argv[2]
for d, _, files in os.walk(src):
    t = os.path.join(dst, os.path.relpath(d, src))
    os.makedirs(t, exist_ok=True)
    for f in files:
        open(os.path.join(t, f), "wb").close()
PY
  tar -cf "$WORK/empty.tar" -C "$WORK/emptysrc" .
  rm -rf "$WORK/emptysrc"
  # rclone sync to S3, the tree then a one-file change.
  export RCLONE_CONFIG_B_TYPE=s3 RCLONE_CONFIG_B_PROVIDER=Other RCLONE_CONFIG_B_ENDPOINT=$EP \
    RCLONE_CONFIG_B_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID RCLONE_CONFIG_B_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY RCLONE_CONFIG_B_FORCE_PATH_STYLE=true
  if [[ " $STORES " == *" s3 "* ]] && [ "${RCLONE:-1}" = 1 ]; then
    mark; settle; t=$(now); env -u AWS_CA_BUNDLE rclone sync -q "$src" "B:bkt/rclone$n"; T=$(since $t); row "$n files" "reference: rclone sync of the tree" "$T" "$(reqs)" -
    cp "$src/d0042/f07" "$WORK/keep"; echo changed > "$src/d0042/f07"
    mark; settle; t=$(now); env -u AWS_CA_BUNDLE rclone sync -q "$src" "B:bkt/rclone$n"; T=$(since $t); row "$n files" "reference: rclone sync after a one-file change" "$T" "$(reqs)" -
    cp "$WORK/keep" "$src/d0042/f07"
  fi
  for store in $STORES; do
    if [ "$store" = s3 ]; then SA=(--store s3://bkt/ck --s3-endpoint "$EP" --s3-path-style); else SA=(--store "file://$WORK/store"); fi
    # Room for the tree: n files and n/100 directories; n x 4 KiB of
    # random bytes (an archive of 100k is 410 MB, over the 256 MiB default).
    SA+=(--max-entries $((n + n / 100 + 1000)) --max-archive-bytes $((n * 8192 + (64 << 20))))
    fmts=$FORMATS; [ "$n" -gt 30000 ] && fmts=$FORMATS_LARGE
    for fmt in $fmts; do
      for serve in $SERVES; do
        id="w$n-$fmt-$serve"; tag="$n files, $fmt, $store, $serve"
        m="$WORK/m-$id"; c=0
        "$AM" mount --daemon "$m" "${SA[@]}" --id "$id" --format "$fmt" --serve "$serve" --load none --cache-dir "$WORK/c-$id-$c" >/dev/null 2>&1
        ready "$m" "$serve"
        cp -a "$src/." "$m/"
        step() { # step NAME TARGET COMMAND...: time it, count its requests
          local name=$1 target=$2; shift 2
          settle; mark; local t; t=$(now); "$@" >/dev/null; local T; T=$(since $t)
          local r="-"; [ "$store" = s3 ] && r=$(reqs)
          row "$tag" "$name" "$T" "$r" "$target"
          LAST=$T
        }
        step "first save" "<= 1.5x tar -czf ($TARC s), <= 100 requests" "$AM" commit "$m"
        FIRST=$LAST
        row "$tag" "first save / tar -czf" "$(printf '%.2fx' "$(ratio $FIRST $TARC)")" - "<= 1.5x"
        echo changed > "$m/d0042/f07"
        W0=$(waits "$m")
        step "save after a one-file change" "<= 10 requests" "$AM" commit "$m"
        split_wait "$m"
        sleep 2  # the prune of the previous revision runs after the save returns
        if [ "$store" = s3 ]; then row "$tag" "prune of one revision (after the save returned)" - "$(tail -c +$((MARK + 1)) "$WORK/access.log" | grep -c ' s3_Delete' || true) deletes" "1 request"; fi
        step "save with no change" - "$AM" commit "$m"
        step "fork's first save (commit --fork)" "<= 5 requests" "$AM" commit --fork "$id-fork" "$m"
        "$AM" unmount --no-save "$m" >/dev/null
        c=1; ml="$m-lazy"
        cdir="$WORK/c-$id-$c"
        if [ "$serve" = native ]; then
          # The floor, side by side and fair: ext4 makes inodes far more
          # slowly for a while after many deletions (this run's own), so
          # tar -x and the lazy mount each get a new ext4 of the same size.
          fresh_fs; settle; t=$(now); tar -xf "$WORK/empty.tar" -C "$WORK/fs"; TARX=$(since $t)
          row "$tag" "reference: tar -x of the same tree of empty files, on a new ext4" "$TARX" - -
          fresh_fs; cdir="$WORK/fs/cache"
        fi
        step "lazy mount-ready, fresh cache dir" "fuse: >= 10x faster than full; native: <= 2x tar -x on a new ext4" \
          "$AM" mount --daemon "$ml" "${SA[@]}" --id "$id" --serve "$serve" --prefetch 0 --no-lock --cache-dir "$cdir"
        LAZY=$LAST
        ready "$ml" "$serve"
        # An agent's checkpoint right after a lazy restore: every other
        # file is still a placeholder.
        echo changed again > "$ml/d0042/f08"
        W0=$(waits "$ml")
        step "save after a one-file change on the lazy mount (placeholders not fetched)" "<= 10 requests" "$AM" commit "$ml"
        split_wait "$ml"
        sleep 2
        shuf -n 2000 --random-source=<(yes) "$WORK/list" > "$WORK/read"
        step "read 2,000 files after the lazy mount" - sh -c "cd '$ml' && xargs cat < '$WORK/read' > /dev/null"
        "$AM" unmount --no-save "$ml" >/dev/null
        [ "$serve" = native ] && umount_fs
        c=2; mf="$m-full"
        step "full restore, fresh cache dir" - "$AM" mount --daemon "$mf" "${SA[@]}" --id "$id" --serve "$serve" --restore full --no-lock --cache-dir "$WORK/c-$id-$c"
        FULL=$LAST
        ready "$mf" "$serve"
        "$AM" unmount --no-save "$mf" >/dev/null
        if [ "$serve" = fuse ]; then
          row "$tag" "lazy mount-ready / full restore" "$(printf '%.1fx faster' "$(ratio $FULL $LAZY)")" - ">= 10x"
        else
          row "$tag" "lazy mount-ready / tar -x of empty files" "$(printf '%.2fx' "$(ratio $LAZY $TARX)")" - "<= 2x"
        fi
      done
    done
  done
  rm -rf "$src"
done

printf '\ncheckpoint: versitygw %s on loopback, kernel %s, %s cores\n\n' "$("$VGW" --version 2>/dev/null | head -1 | awk '{print $NF}')" "$(uname -r)" "$(nproc)"
printf '| tree | step | seconds | requests | target |\n|---|---|---|---|---|\n'
printf '%s\n' "${ROWS[@]}"
