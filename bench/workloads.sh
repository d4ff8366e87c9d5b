#!/usr/bin/env bash
# workloads.sh: real sandbox work saved to an S3 store (versitygw on
# loopback) and run again after a restore on a fresh cache dir:
#   1. npm install of express, typescript, eslint and jest (npm's cache warm
#      from a first, native install), unmount, lazy restore elsewhere, then
#      jest runs without `npm rebuild`; the install's time vs native disk
#   2. python3 -m venv without --copies, the same round trip, then the
#      venv's python runs
#   3. a 12,800-file git repository: after a lazy restore on a fresh cache
#      dir, the first `git status` vs the second, and how many files the
#      first one fetched (lazily restored files still pending, before and
#      after, from `amlfs status`)
# Each is also timed on the native disk, side by side, for the ratios.
# Needs root (FUSE), npm and versitygw (AMLFS_VERSITYGW, as .ci/run installs).
# WORKLOADS picks some of them (default "npm venv git"). The workspaces are
# served as amlfs serves by default (natively where that can run); SERVE=fuse
# or SERVE=native asks for a mode (--serve).
#
#   bash bench/workloads.sh
#   WORKLOADS=git bash bench/workloads.sh
#   SERVE=fuse bash bench/workloads.sh
set -euo pipefail
shopt -s inherit_errexit  # a step that fails inside $(...) stops the run too
cd "$(dirname "$0")/.."
WORK=${BENCH_DIR:-/var/tmp/amlfs-workloads}
. bench/common.sh
S3="--s3-endpoint $EP --s3-path-style"
cleanup() {
  for m in "$WORK"/m*; do "$AM" unmount --no-save "$m" >/dev/null 2>&1 || true; done
  kill $VPID 2>/dev/null || true
}
trap cleanup EXIT
sleep 1
SERVE=${SERVE:-}
SERVED=""
mnt() {
  "$AM" mount --daemon "$WORK/$1" --store s3://bkt/work --id "$2" $S3 --cache-dir "$WORK/cache-$1" ${SERVE:+--serve "$SERVE"} "${@:3}" >/dev/null 2>&1
  local m; m=$(serving "$WORK/$1" amlfs "$AM")
  if [ -n "$SERVE" ] && [ "$m" != "$SERVE" ]; then echo "workloads: --serve $SERVE served $m" >&2; exit 1; fi
  SERVED=$m
}
pending() { "$AM" status "$WORK/$1" --json | sed -n 's/.*"pendingFiles": \([0-9]*\).*/\1/p'; }

only() { [[ " ${WORKLOADS:-npm venv git} " == *" $1 "* ]]; }

# --- 1. npm ---------------------------------------------------------------
if only npm; then
project() {
  mkdir -p "$1/t" && cd "$1"
  npm init -y >/dev/null
  echo 'test("adds", () => { expect(1 + 2).toBe(3); });' > t/add.test.js
  cd - >/dev/null
}
install() { (cd "$1" && npm install --no-audit --no-fund --loglevel=error express typescript eslint jest >/dev/null); }
project "$WORK/native-npm"; install "$WORK/native-npm"   # warms npm's cache
rm -rf "$WORK/native-npm"; project "$WORK/native-npm"
t=$(now); install "$WORK/native-npm"; NPM_NATIVE=$(since $t)
mnt mnpm npm; project "$WORK/mnpm"
t=$(now); install "$WORK/mnpm"; NPM_AMLFS=$(since $t)
NPM_FILES=$(find "$WORK/mnpm/node_modules" | wc -l); NPM_LINKS=$(find "$WORK/mnpm/node_modules" -type l | wc -l)
t=$(now); "$AM" unmount "$WORK/mnpm" >/dev/null; NPM_SAVE=$(since $t)
mnt mnpm2 npm
JEST=$(cd "$WORK/mnpm2" && npx jest 2>&1 | grep -c "1 passed" || true)
"$AM" unmount --no-save "$WORK/mnpm2" >/dev/null
fi

# --- 2. venv --------------------------------------------------------------
if only venv; then
t=$(now); python3 -m venv "$WORK/native-venv"; VENV_NATIVE=$(since $t)
mnt mvenv venv
t=$(now); (cd "$WORK/mvenv" && python3 -m venv venv); VENV_AMLFS=$(since $t)
"$AM" unmount "$WORK/mvenv" >/dev/null
mnt mvenv2 venv
VENV=$("$WORK/mvenv2/venv/bin/python" -c 'import sys; print(sys.prefix)')
[ "$VENV" = "$WORK/mvenv2/venv" ] && VENV=ok || VENV="wrong prefix $VENV"
"$AM" unmount --no-save "$WORK/mvenv2" >/dev/null
fi

# --- 3. git status after a lazy restore -----------------------------------
if only git; then
mkrepo() (
  # Objects packed, and no background auto-gc to run during the timed
  # steps after it.
  cd "$1" && git init -q . && git config user.email b@b && git config user.name b && git config gc.auto 0
  for d in $(seq 0 127); do mkdir "d$d"; for f in $(seq 0 99); do echo "$d $f" > "d$d/f$f.txt"; done; done
  git add -A && git commit -qm init && git gc -q
  # Past git's racy-clean second, as any later moment of a session is.
  sleep 1.1 && git status --porcelain >/dev/null
)
# warm DIR...: a warm `git status` in each DIR in turn, 10 rounds, the
# best of each (one per line, in order): side by side, as the machine's
# noise at a few tens of milliseconds falls on both alike.
warm() {
  local -a best; local i d s t
  for _ in $(seq 10); do
    i=0
    for d in "$@"; do
      t=$(now); (cd "$d" && git status --porcelain >/dev/null); s=$(since $t)
      if [ -z "${best[$i]:-}" ] || (( $(echo "$s < ${best[$i]}" | bc -l) )); then best[$i]=$s; fi
      i=$((i + 1))
    done
  done
  printf '%s\n' "${best[@]}"
}
mkdir -p "$WORK/native-git"; mkrepo "$WORK/native-git"
mnt mgit repo
mkrepo "$WORK/mgit"
{ read -r GITW_NATIVE; read -r GITW_AMLFS; } < <(warm "$WORK/native-git" "$WORK/mgit")
"$AM" unmount "$WORK/mgit" >/dev/null
mnt mgit2 repo --prefetch 0
P0=$(pending mgit2)
t=$(now); (cd "$WORK/mgit2" && git status --porcelain >/dev/null); GIT1=$(since $t)
P1=$(pending mgit2)
t=$(now); (cd "$WORK/mgit2" && git status --porcelain >/dev/null); GIT2=$(since $t)
"$AM" unmount --no-save "$WORK/mgit2" >/dev/null
fi

printf '\nserving: %s (%s)\n' "$SERVED" "${SERVE:+--serve $SERVE}${SERVE:-the default}"
if only npm; then
  printf 'npm install (express typescript eslint jest, warm npm cache): %s entries, %s symlinks in node_modules\n' "$NPM_FILES" "$NPM_LINKS"
  printf '  native %.2fs  amlfs %.2fs  ratio %.2fx; save to S3 %.2fs; jest after a lazy restore elsewhere: %s\n' \
    "$NPM_NATIVE" "$NPM_AMLFS" "$(ratio $NPM_AMLFS $NPM_NATIVE)" "$NPM_SAVE" "$([ "$JEST" -ge 1 ] && echo passes || echo FAILS)"
fi
if only venv; then printf 'python3 -m venv: native %.2fs  amlfs %.2fs  ratio %.2fx; after a lazy restore elsewhere: %s\n' "$VENV_NATIVE" "$VENV_AMLFS" "$(ratio $VENV_AMLFS $VENV_NATIVE)" "$VENV"; fi
if only git; then
  printf 'git status (warm, best of 10 alternating), 12,800 files: native %.3fs  amlfs %.3fs  ratio %.2fx\n' "$GITW_NATIVE" "$GITW_AMLFS" "$(ratio $GITW_AMLFS $GITW_NATIVE)"
  printf 'git status, 12,800 files, after a lazy restore on a fresh cache dir: first %.2fs, second %.2fs, ratio %.2fx; the first fetched %s of %s pending files\n' \
    "$GIT1" "$GIT2" "$(ratio $GIT1 $GIT2)" "$((P0 - P1))" "$P0"
fi
