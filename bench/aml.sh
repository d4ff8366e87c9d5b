#!/usr/bin/env bash
# aml.sh: acquire and one-file-change save of a 10k-file workspace
# (100 directories of 100 files of 4 KiB) through amlfsWorkspace
# (clients/aml), beside AML's own filesystemWorkspace on a file store and
# s3Workspace on S3 (versitygw on loopback): each its own workspace of the
# same files in the same store, saved by itself (its steady state), targets
# rotated each round. amlfsWorkspace runs served as amlfs's default does
# (natively here), and through FUSE (serve: "fuse"); its acquire is timed on
# the cache dir its last release used (natively, where the tree it kept is
# adopted) and on a fresh one. Reports each one's median and the ratios
# (AML's provider / amlfs's: how many times faster amlfs is).
# Needs root (FUSE or native serving), node 22.13 or later, versitygw
# (AMLFS_VERSITYGW, as .ci/run installs it) and npm.
#
#   bash bench/aml.sh            FILES=10000 ROUNDS=3 by default
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
WORK=${BENCH_DIR:-/var/tmp/amlfs-aml-bench}
rm -rf "$WORK"; mkdir -p "$WORK"
go build -o "$WORK/amlfs" ./cmd/amlfs
export AMLFS_BIN="$WORK/amlfs" TMPDIR="$WORK"
export AMLFS_VERSITYGW=${AMLFS_VERSITYGW:-$HOME/.cache/amlfs-tools/versitygw}
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>22||(a===22&&b>=13)?0:1)' ||
  { echo "aml.sh: node 22.13 or later is needed (node $(node --version)); .ci/run keeps one in ~/.cache/amlfs-tools" >&2; exit 1; }
(cd clients && npm ci --no-audit --no-fund --loglevel=error >/dev/null && npm run build --workspace=@amlfs/client >/dev/null &&
  cd aml && node test/vendor.mjs && TSX_TSCONFIG_PATH=tsconfig.test.json node --import tsx bench/acquire-save.ts) > "$WORK/out.json"
node - "$WORK/out.json" <<'JS'
const lines = require("fs").readFileSync(process.argv[2], "utf8").trim().split("\n").map(l => JSON.parse(l))
const med = a => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)] }
for (const { store, files, rounds, times } of lines) {
  const [theirs, ...ours] = Object.keys(times)
  console.log(`\n${store} store, ${files} files, median of ${rounds} rounds; ratio: ${theirs} / amlfs (target >= 10x)\n`)
  console.log(`| step | ${theirs} s | ${ours.map(o => `${o} s | ratio`).join(" | ")} |\n|---|---|${ours.map(() => "---|---").join("|")}|`)
  const rows = { acquire: "acquire", cold: "acquire, amlfs on a fresh cache dir", save: "one-file-change save" }
  for (const [step, label] of Object.entries(rows)) {
    const t = med(times[theirs][step === "cold" ? "acquire" : step])
    const cells = ours.map(o => { const v = med(times[o][step]); return `${v.toFixed(3)} | ${(t / v).toFixed(1)}x` })
    console.log(`| ${label} | ${t.toFixed(3)} | ${cells.join(" | ")} |`)
  }
}
JS
