#!/usr/bin/env bash
# blocking-lat.sh: message latency of blocking waits (no --busy-poll: spin briefly, then
# sleep) against busy polling, in the same run, for one or more `rdmx` binaries run
# alternately (so that an old and a new build see the same host).
#
# Usage:  bench/blocking-lat.sh [RDMX_BINARY ...] > results.md   (progress goes to stderr)
#         default binary: target/release/rdmx (built when SKIP_BUILD is not 1)
#
# Per repetition and binary, each `rdmx perf --layer msg --local --test lat`:
#   100 KB blocking     (rendezvous; default busy-poll time, 50 us)       ITERS iterations
#   100 KB busy-polled  (--busy-poll)                                      ITERS iterations
#   8 B without spin    (RDMX_BUSY_POLL_US=0: every wait sleeps)           ITERS iterations
# Every one-way latency is kept (`--samples`); the table gives p50 / p99 / p99.9 / max in
# microseconds, and the ratios blocking / busy-polled of the same repetition.
#
# Environment: REPS=3 ITERS=20000 SKIP_BUILD=0
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPS=${REPS:-3}
ITERS=${ITERS:-20000}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/blocking-lat.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log() { printf '%s\n' "$*" >&2; }

if (($# == 0)); then
    if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
        log "building rdmx (release)"
        (cd "$ROOT" && cargo build --release -q -p rdmx-tools)
    fi
    set -- "$ROOT/target/release/rdmx"
fi

# stats FILE -> "p50 p99 p999 max" (us) of the `size ns` lines in FILE
stats() {
    awk '{ print $2 / 1000 }' "$1" | sort -n | awk '{ v[n++] = $1 } END {
        if (n == 0) { print "n/a n/a n/a n/a"; exit }
        printf "%.1f %.1f %.1f %.1f\n", v[int(n * 0.50)], v[int(n * 0.99)], v[int(n * 0.999)], v[n - 1]
    }'
}

run() { # BIN OUT [ENV=VAL ...] -- PERF ARGS...
    local bin=$1 out=$2
    shift 2
    local -a envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" "$bin" perf --layer msg --local --test lat --iters "$ITERS" \
        --samples "$out" "$@" >/dev/null
}

echo "| rep | binary | 100 KB blocking p50 / p99 / p99.9 / max | 100 KB busy-polled p50 / p99 / p99.9 / max | blocking / busy p50, p99 | 8 B no spin p50 / p99 / p99.9 / max |"
echo "| --- | --- | --- | --- | --- | --- |"
for ((r = 1; r <= REPS; r++)); do
    for bin in "$@"; do
        name=$(basename "$bin")
        log "rep $r: $name"
        run "$bin" "$TMP/block" -- --size 100000
        run "$bin" "$TMP/busy" -- --size 100000 --busy-poll
        run "$bin" "$TMP/nospin" RDMX_BUSY_POLL_US=0 -- --size 8
        read -r b50 b99 b999 bmax <<<"$(stats "$TMP/block")"
        read -r p50 p99 p999 pmax <<<"$(stats "$TMP/busy")"
        read -r n50 n99 n999 nmax <<<"$(stats "$TMP/nospin")"
        ratio50=$(awk -v a="$b50" -v b="$p50" 'BEGIN { printf "%.2f", a / b }')
        ratio99=$(awk -v a="$b99" -v b="$p99" 'BEGIN { printf "%.2f", a / b }')
        echo "| $r | $name | $b50 / $b99 / $b999 / $bmax | $p50 / $p99 / $p999 / $pmax | $ratio50, $ratio99 | $n50 / $n99 / $n999 / $nmax |"
    done
done
