#!/usr/bin/env bash
# livebench.sh: an S3 live mount (versitygw on loopback) against rclone mount
# --vfs-cache-mode full, s3fs and a plain directory, side by side in one
# run, reported as ratios. The workload: untar the Go source tree, find,
# ls -lR, grep -r, rm -rf, then a sequential 1 GiB write, the same ended by
# fsync, and a cold sequential 1 GiB read. Two amlfs targets: amlfs (the
# default FUSE serving, the live mount grafted into one connection) and amn
# (--serve native: the live mount its own FUSE connection, answering ENOSYS
# to xattr requests).
# Needs root (FUSE), versitygw (AMLFS_VERSITYGW, as .ci/run installs it),
# and installs rclone and s3fs from Debian if missing.
#
#   bash bench/livebench.sh            # every tool
#   TOOLS="native amlfs" bash bench/livebench.sh
set -euo pipefail
shopt -s inherit_errexit  # a step that fails inside $(...) stops the run too
cd "$(dirname "$0")/.."
WORK=${BENCH_DIR:-/var/tmp/amlfs-livebench}
TOOLS=${TOOLS:-native amlfs amn rclone s3fs}
for t in rclone s3fs; do
  case " $TOOLS " in *" $t "*) command -v $t >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $t >/dev/null;; esac
done

. bench/common.sh
MNT="$WORK/mnt"
cleanup() {
  "$AM" unmount --no-save "$MNT" >/dev/null 2>&1 || true
  fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
  kill $VPID 2>/dev/null || true
}
trap cleanup EXIT
sleep 1

tar -C "$(go env GOROOT)" -cf "$WORK/src.tar" src
FILES=$(tar -tf "$WORK/src.tar" | wc -l)
head -c $((1 << 30)) /dev/urandom > "$WORK/gib"

settle() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; }

# mount_TOOL DIR PREFIX mounts the tool's view of s3://bkt/PREFIX at DIR.
mount_native() { mkdir -p "$WORK/native/$2"; ln -sfn "$WORK/native/$2" "$1"; }
umount_native() { rm -f "$1"; }
mount_amlfs() {
  mkdir -p "$1"
  "$AM" mount --daemon "$1" --serve fuse --store none --mount "/d=s3://bkt/$2" --s3-endpoint "$EP" --s3-path-style --cache-dir "$WORK/amlfs-cache" >/dev/null
  mounted "$1" amlfs
  ln -sfn "$1/d" "$WORK/view"
}
umount_amlfs() { "$AM" unmount "$1" >/dev/null; }
mount_amn() {
  mkdir -p "$1"
  "$AM" mount --daemon "$1" --serve native --store none --mount "/d=s3://bkt/$2" --s3-endpoint "$EP" --s3-path-style --cache-dir "$WORK/amlfs-cache" >/dev/null
  mounted_native "$1" amn "$AM"
  mounted "$1/d" amn
  ln -sfn "$1/d" "$WORK/view"
}
umount_amn() { umount_amlfs "$@"; }
mount_rclone() {
  mkdir -p "$1"
  env -u AWS_CA_BUNDLE RCLONE_CONFIG_B_TYPE=s3 RCLONE_CONFIG_B_PROVIDER=Other RCLONE_CONFIG_B_ENDPOINT="$EP" \
    RCLONE_CONFIG_B_ACCESS_KEY_ID=benchkey RCLONE_CONFIG_B_SECRET_ACCESS_KEY=benchsecret RCLONE_CONFIG_B_FORCE_PATH_STYLE=true \
    rclone mount "B:bkt/$2" "$1" --vfs-cache-mode full --cache-dir "$WORK/rclone-cache" --daemon
  mounted "$1" rclone
}
umount_rclone() { fusermount3 -u "$1" 2>/dev/null || fusermount -u "$1"; sleep 1; }
mount_s3fs() {
  mkdir -p "$1"
  echo benchkey:benchsecret > "$WORK/s3fs.passwd"; chmod 600 "$WORK/s3fs.passwd"
  mkdir -p "$WORK/data/bkt/$2"
  env -u AWS_CA_BUNDLE s3fs "bkt:/$2" "$1" -o url="$EP" -o use_path_request_style -o passwd_file="$WORK/s3fs.passwd" -o use_cache="$WORK/s3fs-cache"
  mounted "$1" s3fs
}
umount_s3fs() { fusermount3 -u "$1" 2>/dev/null || fusermount -u "$1"; sleep 1; }

# view is where the tool's tree is seen: the amlfs live mount is at /d.
declare -A R
for tool in $TOOLS; do
  "mount_$tool" "$MNT" "$tool"
  case $tool in amlfs|amn) ;; *) ln -sfn "$MNT" "$WORK/view" ;; esac
  V=$(readlink -f "$WORK/view")
  settle; t=$(now); tar -C "$V" -xf "$WORK/src.tar"; R[$tool.untar]=$(since $t)
  if [ "$tool" = amlfs ] || [ "$tool" = amn ]; then
    # The same untar until the bucket holds it all.
    while [ "$("$AM" status "$MNT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["pending"])')" != 0 ]; do sleep 0.1; done
    R[$tool.uploaded]=$(since $t)
  fi
  settle; t=$(now); find "$V/src" >/dev/null; R[$tool.find]=$(since $t)
  settle; t=$(now); ls -lR "$V/src" >/dev/null; R[$tool.ls]=$(since $t)
  settle; t=$(now); grep -r amlfs-no-such-string "$V/src" >/dev/null || true; R[$tool.grep]=$(since $t)
  settle; t=$(now); rm -rf "$V/src"; R[$tool.rm]=$(since $t)
  # The durable write first, so that no upload of the plain write's file
  # is still running under it.
  settle; t=$(now); dd if="$WORK/gib" of="$V/gib2" bs=1M conv=fsync status=none; R[$tool.fsync]=$(since $t)
  settle; t=$(now); dd if="$WORK/gib" of="$V/gib" bs=1M status=none; R[$tool.write]=$(since $t)
  "umount_$tool" "$MNT"
  # A cold read of an object put with the AWS CLI: a new mount, no cache.
  if [ "$tool" = native ]; then cp "$WORK/gib" "$WORK/native/$tool/gibr"; else
    env -u AWS_CA_BUNDLE "$AWS" --endpoint-url "$EP" s3 cp --quiet "$WORK/gib" "s3://bkt/$tool/gibr"; fi
  rm -rf "$WORK/amlfs-cache" "$WORK/rclone-cache" "$WORK/s3fs-cache"
  "mount_$tool" "$MNT" "$tool"
  case $tool in amlfs|amn) ;; *) ln -sfn "$MNT" "$WORK/view" ;; esac
  V=$(readlink -f "$WORK/view")
  settle; t=$(now); cmp "$V/gibr" "$WORK/gib"; R[$tool.read]=$(since $t)
  "umount_$tool" "$MNT"
done

printf '\nlivebench: the Go source tree (%d entries, %s), versitygw on loopback, kernel %s\n\n' "$FILES" "$(du -sh "$WORK/src.tar" | cut -f1)" "$(uname -r)"
printf '| step |'; for t in $TOOLS; do printf ' %s s |' "$t"; done
AMS=""
for t in amlfs amn; do case " $TOOLS " in *" $t "*) AMS="$AMS $t" ;; esac; done
for a in $AMS; do printf ' %s vs the faster of rclone and s3fs |' "$a"; done
printf '\n|---|'; for t in $TOOLS $AMS; do printf -- '---|'; done; printf '\n'
for s in untar find ls grep rm fsync write read; do
  printf '| %s |' "$s"
  for t in $TOOLS; do printf ' %.2f |' "${R[$t.$s]:-0}"; done
  best=""
  for t in rclone s3fs; do
    v=${R[$t.$s]:-}
    [ -n "$v" ] || continue
    if [ -z "$best" ] || (( $(echo "$v < $best" | bc -l) )); then best=$v; fi
  done
  for a in $AMS; do
    if [ -n "$best" ] && [ -n "${R[$a.$s]:-}" ]; then printf ' %.1fx faster |' "$(echo "$best / ${R[$a.$s]}" | bc -l)"; else printf ' |'; fi
  done
  printf '\n'
done
for a in $AMS; do
  [ -n "${R[$a.uploaded]:-}" ] && printf '\n%s untar until every object was uploaded: %.2f s' "$a" "${R[$a.uploaded]}"
done
echo
echo "step: untar, find, ls -lR, grep -r (no match), rm -rf of the tree; write: 1 GiB dd; fsync: 1 GiB dd ended by fsync; read: cmp of 1 GiB on a fresh mount"
