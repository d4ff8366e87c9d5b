# mounted.sh: sourced by the benchmarks.
# mounted DIR WHAT: wait up to 10 s for DIR to be a FUSE mount point, and
# exit the benchmark if it is not. A target whose mount failed is a plain
# directory: timed anyway, it would report the disk's speed as the mount's
# (fsbench once showed the go-fuse loopback at 1.0x on a machine without
# fusermount).
mounted() {
  local fs=""
  for _ in $(seq 100); do
    fs=$(findmnt -n -o FSTYPE --mountpoint "$1" 2>/dev/null || true)
    case $fs in fuse*) return 0 ;; esac
    sleep 0.1
  done
  echo "$(basename "$0"): $2 is not mounted at $1 (${fs:-no mount there}); refusing to time a plain directory" >&2
  exit 1
}

# mounted_native DIR WHAT AMLFS: wait up to 10 s for amlfs to serve DIR
# natively (a bind mount, so no FUSE type to look for): its status must
# say so.
mounted_native() {
  for _ in $(seq 100); do
    if "$3" status "$1" 2>/dev/null | grep -q '^serve: *native'; then return 0; fi
    sleep 0.1
  done
  echo "$(basename "$0"): $2 is not serving $1 natively; refusing to time a plain directory" >&2
  exit 1
}

# serving DIR WHAT AMLFS: wait up to 10 s for amlfs to serve DIR, in
# whichever mode it chose (the default, --serve auto), and print that mode.
serving() {
  local m
  for _ in $(seq 100); do
    m=$("$3" status "$1" 2>/dev/null | sed -n 's/^serve: *\([a-z]*\).*/\1/p')
    if [ -n "$m" ]; then
      if [ "$m" = fuse ]; then mounted "$1" "$2"; fi
      echo "$m"; return 0
    fi
    sleep 0.1
  done
  echo "$(basename "$0"): $2 is not serving $1; refusing to time a plain directory" >&2
  exit 1
}
