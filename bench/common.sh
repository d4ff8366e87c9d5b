# common.sh: what the S3 benchmarks share; sourced with WORK set.
# Installs awscli from Debian if missing, builds amlfs into $WORK/bin
# (AM), and starts versitygw on a loopback port (EP, VPID) over
# $WORK/data with bucket "bkt", with credentials exported for amlfs and
# the AWS CLI. Its access log ($WORK/access.log) counts requests: mark
# before a step, then reqs prints the requests since, by operation.
VGW=${AMLFS_VERSITYGW:-$HOME/.cache/amlfs-tools/versitygw}
AWS=/usr/bin/aws   # Debian's awscli (a pyenv shim may shadow it on PATH)
[ -x "$AWS" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq awscli >/dev/null

. bench/mounted.sh
rm -rf "$WORK"; mkdir -p "$WORK"/{data/bkt,bin,run}
go build -o "$WORK/bin/amlfs" ./cmd/amlfs
AM="$WORK/bin/amlfs"
PORT=$((20000 + RANDOM % 20000))
"$VGW" --port 127.0.0.1:$PORT --access benchkey --secret benchsecret --access-log "$WORK/access.log" posix "$WORK/data" >"$WORK/vgw.log" 2>&1 &
VPID=$!
export AWS_ACCESS_KEY_ID=benchkey AWS_SECRET_ACCESS_KEY=benchsecret AWS_REGION=us-east-1 AMLFS_RUNTIME_DIR="$WORK/run"
EP=http://127.0.0.1:$PORT

now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc -l; }
ratio() { echo "$1 / $2" | bc -l; }

MARK=0
mark() { MARK=$(stat -c %s "$WORK/access.log" 2>/dev/null || echo 0); }
# reqs: "N (Op n, ...)" for the requests logged since the last mark.
reqs() {
  tail -c +$((MARK + 1)) "$WORK/access.log" 2>/dev/null | { grep -o ' s3_[A-Za-z]*' || true; } | sed 's/ s3_//' | sort | uniq -c |
    awk '{n += $1; s = s (s ? ", " : "") $2 " " $1} END {printf "%d (%s)", n, s}'
}

# make_tree DIR N: N files of 4 KiB of random bytes under DIR, in
# directories of 100 (d0000/f00 ...).
make_tree() {
  python3 - "$1" "$2" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%04d" % (i // 100))
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%02d" % (i % 100)), "wb") as f:
        f.write(os.urandom(4096))
PY
}
