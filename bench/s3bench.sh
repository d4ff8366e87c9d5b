#!/usr/bin/env bash
# s3bench.sh: amlfs on an S3 store (versitygw on loopback), measured side by
# side in one run, reported as ratios.
#   1. time to a ready mount of a 10k-file / 200 MB folder revision: lazy vs full
#   2. save after changing 1 file of it: incremental vs a full upload
#   3. save and restore of a 1 GiB tree vs `aws s3 cp --recursive` up and down
# Needs root (FUSE) and versitygw (AMLFS_VERSITYGW, as .ci/run installs it);
# installs awscli from Debian if missing.
#
#   bash bench/s3bench.sh
set -euo pipefail
shopt -s inherit_errexit  # a step that fails inside $(...) stops the run too
cd "$(dirname "$0")/.."
WORK=${BENCH_DIR:-/var/tmp/amlfs-s3bench}
. bench/common.sh
mkdir -p "$WORK/src"
S3="--s3-endpoint $EP --s3-path-style"
cleanup() {
  for m in "$WORK"/m*; do "$AM" unmount --no-save "$m" >/dev/null 2>&1 || true; done
  kill $VPID 2>/dev/null || true
  # Delete the trees now, not at the next run's start, where ext4's slow
  # inode allocation after deletions would bill them to its timed steps.
  rm -rf "$WORK"
}
trap cleanup EXIT
sleep 1


# --- 1 and 2: 10k files, 200 MB -------------------------------------------
m="$WORK/m10k"
"$AM" mount --daemon "$m" --serve fuse --store s3://bkt/bench --id tenk $S3 --cache-dir "$WORK/c0" >/dev/null 2>&1
mounted "$m" amlfs
# 100 directories of 100 files of 20,000 random bytes (f00 to f99).
for d in $(seq 0 99); do mkdir "$m/d$d"; head -c 2000000 /dev/urandom | split -b 20000 -d -a 2 - "$m/d$d/f"; done
"$AM" unmount "$m" >/dev/null

# Each timed step starts with the disk idle: the setup's writeback is not
# billed to the step after it.
settle() { sync; sleep 1; }
settle; t=$(now); "$AM" mount --daemon "$WORK/mlazy" --serve fuse --store s3://bkt/bench --id tenk $S3 --cache-dir "$WORK/c1" --restore lazy --prefetch 0 >/dev/null 2>&1; LAZY=$(since $t)
mounted "$WORK/mlazy" amlfs
settle; t=$(now); "$AM" mount --daemon "$WORK/mfull" --serve fuse --store s3://bkt/bench --id tenk $S3 --cache-dir "$WORK/c2" --restore full --no-lock >/dev/null 2>&1; FULL=$(since $t)
mounted "$WORK/mfull" amlfs
# The mounts stay until the end of this part: an unmount --no-save deletes
# its tree, and ext4 then makes new inodes slowly for minutes (each one
# allocated skips, one by one, the inodes deleted in the last 60 s or
# more: recently_deleted() in fs/ext4/ialloc.c), which would bill the
# deletion to the next step that makes 10k files.
# The same lazy mount served natively (--serve native): every directory
# and placeholder is made, and every placeholder marked, before it is ready.
settle; t=$(now); "$AM" mount --daemon "$WORK/mnlazy" --serve native --store s3://bkt/bench --id tenk $S3 --cache-dir "$WORK/c1n" --restore lazy --prefetch 0 --no-lock >/dev/null 2>&1; NLAZY=$(since $t)
mounted_native "$WORK/mnlazy" "amlfs native" "$AM"

echo changed > "$WORK/mlazy/d42/f07"
settle; t=$(now); "$AM" commit "$WORK/mlazy" >/dev/null; INC=$(since $t)
# A full upload of the same tree: the same save with nothing to reuse.
"$AM" mount --daemon "$WORK/mcopy" --serve fuse --store s3://bkt/bench --id tenk-copy $S3 --cache-dir "$WORK/c3" --load none >/dev/null 2>&1
mounted "$WORK/mcopy" amlfs
cp -a "$WORK/mlazy/." "$WORK/mcopy/"
settle; t=$(now); "$AM" commit "$WORK/mcopy" >/dev/null; FULLSAVE=$(since $t)
for m in mcopy mlazy mfull mnlazy; do "$AM" unmount --no-save "$WORK/$m" >/dev/null; done

# --- 3: a 1 GiB tree: 64 files of 16 MiB ----------------------------------
for i in $(seq 0 63); do head -c 16777216 /dev/urandom > "$WORK/src/f$i"; done
m="$WORK/mgib"
"$AM" mount --daemon "$m" --serve fuse --store s3://bkt/bench --id gib $S3 --cache-dir "$WORK/c4" >/dev/null 2>&1
mounted "$m" amlfs
cp -a "$WORK/src/." "$m/"
settle; t=$(now); "$AM" unmount "$m" >/dev/null; SAVE=$(since $t)
settle; t=$(now); "$AM" mount --daemon "$WORK/mgib2" --serve fuse --store s3://bkt/bench --id gib $S3 --cache-dir "$WORK/c5" --restore full >/dev/null 2>&1; RESTORE=$(since $t)
mounted "$WORK/mgib2" amlfs
# Incremental save where the files are large: change 1 of the 64.
head -c 16777216 /dev/urandom > "$WORK/mgib2/f9"
settle; t=$(now); "$AM" commit "$WORK/mgib2" >/dev/null; INCBIG=$(since $t)
"$AM" unmount --no-save "$WORK/mgib2" >/dev/null
settle; t=$(now); env -u AWS_CA_BUNDLE "$AWS" --endpoint-url "$EP" s3 cp --recursive --quiet "$WORK/src" s3://bkt/awscli/ ; AWSUP=$(since $t)
settle; t=$(now); env -u AWS_CA_BUNDLE "$AWS" --endpoint-url "$EP" s3 cp --recursive --quiet s3://bkt/awscli/ "$WORK/down" ; AWSDOWN=$(since $t)

printf '\ns3bench: versitygw %s on loopback, kernel %s\n\n' "$("$VGW" --version 2>/dev/null | head -1 | awk '{print $NF}')" "$(uname -r)"
printf '| measure | amlfs s | reference s | ratio | target |\n|---|---|---|---|---|\n'
printf '| ready mount, 10k files / 200 MB: lazy vs full restore | %.2f | %.2f | %.1fx faster | >= 10x |\n' "$LAZY" "$FULL" "$(ratio $FULL $LAZY)"
printf '| ready mount served natively, 10k files / 200 MB: lazy vs full restore | %.2f | %.2f | %.1fx faster | >= 10x |\n' "$NLAZY" "$FULL" "$(ratio $FULL $NLAZY)"
printf '| save after changing 1 of 10k files: incremental vs full upload | %.2f | %.2f | %.1fx faster | >= 20x |\n' "$INC" "$FULLSAVE" "$(ratio $FULLSAVE $INC)"
printf '| save after changing 1 of 64 x 16 MiB files: incremental vs the full 1 GiB save | %.2f | %.2f | %.1fx faster | (none) |\n' "$INCBIG" "$SAVE" "$(ratio $SAVE $INCBIG)"
printf '| save 1 GiB (64 x 16 MiB) vs aws s3 cp --recursive up | %.2f | %.2f | %.2fx the time | <= 1x |\n' "$SAVE" "$AWSUP" "$(ratio $SAVE $AWSUP)"
printf '| restore 1 GiB vs aws s3 cp --recursive down | %.2f | %.2f | %.2fx the time | <= 1x |\n' "$RESTORE" "$AWSDOWN" "$(ratio $RESTORE $AWSDOWN)"
