#!/usr/bin/env bash
# compare-rpc.sh: rdmx-rpc echo calls (`rdmx perf --layer rpc --local`) against a tonic gRPC
# echo (bench/rpc-compare), and against rdmx's own message round trip (`rdmx perf --layer
# msg --test lat`), in one run on this machine; prints a markdown report.
#
# Usage:  bench/compare-rpc.sh > results.md        (progress goes to stderr)
#
# Measured, REPS times each, interleaved (medians shown, and the median of the per-rep
# ratios):
#   sequential 8 B calls: rdmx (handlers inline on the link's reader thread, and on the
#     pool), blocking and busy-polling; tonic (depth 1);
#   64 calls in flight: rdmx (inline and pool); tonic (depth 64);
#   rdmx's message round trip (2 x the one-way latency of `--layer msg --test lat`), to put
#     the RPC call latency against.
#
# Environment knobs: REPS=5 SIZE=8 CALLS=20000 (sequential) RATE_CALLS=200000 (in flight)
#   TONIC_SECS=2 SKIP_BUILD=1 KEEP_LOGS=1. No pinning: on 2 CPUs client and server share them.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPS=${REPS:-5}
SIZE=${SIZE:-8}
CALLS=${CALLS:-20000}
RATE_CALLS=${RATE_CALLS:-200000}
TONIC_SECS=${TONIC_SECS:-2}
RDMX="$ROOT/target/release/rdmx"
TONIC_DIR="$ROOT/bench/rpc-compare"
TONIC="$TONIC_DIR/target/release/rpc-compare"
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/compare-rpc.XXXXXX")
RESULTS="$LOGDIR/results.jsonl"

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
cleanup() {
    if [[ "${KEEP_LOGS:-0}" == 1 ]]; then log "logs kept in $LOGDIR"; else rm -rf "$LOGDIR"; fi
}
trap cleanup EXIT

build_rdmx
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    log "building rpc-compare (tonic)"
    if ! cargo build --release --manifest-path "$TONIC_DIR/Cargo.toml" >"$LOGDIR/build-tonic.log" 2>&1; then
        tail -n 20 "$LOGDIR/build-tonic.log" >&2 || true
        log "building rpc-compare failed: tonic columns will be n/a"
    fi
fi

# run NAME REP CMD...: runs CMD (a JSON line on stdout), tags it and appends it.
run() {
    local name=$1 rep=$2
    shift 2
    local out
    if out=$(timeout 300 "$@" 2>>"$LOGDIR/$name.err" | tail -n 1) && [[ "$out" == "{"* ]]; then
        printf '{"name":"%s","rep":%s,"r":%s}\n' "$name" "$rep" "$out" >>"$RESULTS"
        log "  $name: $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print({k: d.get(k) for k in ("calls_per_s","lat_p50_us","lat_p99_us")})' "$out")"
    else
        log "  $name: failed (see $LOGDIR/$name.err)"
    fi
}

for rep in $(seq 1 "$REPS"); do
    log "rep $rep/$REPS"
    run msg_lat "$rep" "$RDMX" perf --layer msg --local --test lat --size "$SIZE" --iters "$CALLS" --json
    run msg_lat_busy "$rep" "$RDMX" perf --layer msg --local --test lat --size "$SIZE" --iters "$CALLS" --busy-poll --json
    run rpc_seq_inline "$rep" "$RDMX" perf --layer rpc --local --test lat --size "$SIZE" --iters "$CALLS" --rpc-threads 0 --json
    run rpc_seq_inline_busy "$rep" "$RDMX" perf --layer rpc --local --test lat --size "$SIZE" --iters "$CALLS" --rpc-threads 0 --busy-poll --json
    run rpc_seq_pool "$rep" "$RDMX" perf --layer rpc --local --test lat --size "$SIZE" --iters "$CALLS" --rpc-threads 2 --json
    run rpc_64_inline "$rep" "$RDMX" perf --layer rpc --local --test rate --size "$SIZE" --iters "$RATE_CALLS" --rpc-depth 64 --rpc-threads 0 --json
    run rpc_64_pool "$rep" "$RDMX" perf --layer rpc --local --test rate --size "$SIZE" --iters "$RATE_CALLS" --rpc-depth 64 --rpc-threads 2 --json
    if [[ -x "$TONIC" ]]; then
        run tonic_seq "$rep" "$TONIC" bench --local --size "$SIZE" --secs "$TONIC_SECS" --depth 1 --json
        run tonic_64 "$rep" "$TONIC" bench --local --size "$SIZE" --secs "$TONIC_SECS" --depth 64 --json
    fi
done

echo "# RPC echo: rdmx-rpc vs tonic gRPC, same machine, same run"
echo
echo "* date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); git $(git -C "$ROOT" rev-parse --short HEAD)"
echo "* CPUs: $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); no pinning"
echo "* load: $(cut -d' ' -f1-3 /proc/loadavg); repetitions: $REPS, interleaved; $SIZE-byte payloads"
echo
python3 - "$RESULTS" <<'EOF'
import json, statistics as st, sys
from collections import defaultdict
runs = defaultdict(dict)
for line in open(sys.argv[1]):
    d = json.loads(line)
    runs[d["name"]][d["rep"]] = d["r"]
def med(name, key, f=lambda x: x):
    v = [f(r[key]) for r in runs.get(name, {}).values() if r.get(key) is not None]
    return st.median(v) if v else None
def ratio(a, ka, b, kb, fa=lambda x: x, fb=lambda x: x):
    reps = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
    v = [fa(runs[a][r][ka]) / fb(runs[b][r][kb]) for r in reps
         if runs[a][r].get(ka) and runs[b][r].get(kb)]
    return st.median(v) if v else None
fmt = lambda x, d=1: "n/a" if x is None else f"{x:,.{d}f}"
print("| measure | rdmx inline | rdmx inline, busy-poll | rdmx pool | tonic | rdmx inline / tonic (paired) |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
print(f"| sequential calls/s | {fmt(med('rpc_seq_inline','calls_per_s'),0)} | {fmt(med('rpc_seq_inline_busy','calls_per_s'),0)} | {fmt(med('rpc_seq_pool','calls_per_s'),0)} | {fmt(med('tonic_seq','calls_per_s'),0)} | {fmt(ratio('rpc_seq_inline','calls_per_s','tonic_seq','calls_per_s'),2)} |")
print(f"| sequential p50 / p99 (us) | {fmt(med('rpc_seq_inline','lat_p50_us'))} / {fmt(med('rpc_seq_inline','lat_p99_us'))} | {fmt(med('rpc_seq_inline_busy','lat_p50_us'))} / {fmt(med('rpc_seq_inline_busy','lat_p99_us'))} | {fmt(med('rpc_seq_pool','lat_p50_us'))} / {fmt(med('rpc_seq_pool','lat_p99_us'))} | {fmt(med('tonic_seq','lat_p50_us'))} / {fmt(med('tonic_seq','lat_p99_us'))} | |")
print(f"| 64 in flight, calls/s | {fmt(med('rpc_64_inline','calls_per_s'),0)} | | {fmt(med('rpc_64_pool','calls_per_s'),0)} | {fmt(med('tonic_64','calls_per_s'),0)} | {fmt(ratio('rpc_64_inline','calls_per_s','tonic_64','calls_per_s'),2)} |")
print()
print("RPC call latency against the message round trip (2 x msg one-way p50), paired medians:")
print()
print(f"* blocking: RPC p50 {fmt(med('rpc_seq_inline','lat_p50_us'))} us, message round trip {fmt(med('msg_lat','lat_p50_us', lambda x: 2*x))} us, ratio {fmt(ratio('rpc_seq_inline','lat_p50_us','msg_lat','lat_p50_us', fb=lambda x: 2*x),2)}")
print(f"* busy-polling: RPC p50 {fmt(med('rpc_seq_inline_busy','lat_p50_us'))} us, message round trip {fmt(med('msg_lat_busy','lat_p50_us', lambda x: 2*x))} us, ratio {fmt(ratio('rpc_seq_inline_busy','lat_p50_us','msg_lat_busy','lat_p50_us', fb=lambda x: 2*x),2)}")
print()
print("## Runs")
print()
print("| name | rep | calls/s | p50 | p99 | p99.9 |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name in sorted(runs):
    for rep in sorted(runs[name]):
        r = runs[name][rep]
        print(f"| {name} | {rep} | {fmt(r.get('calls_per_s') or r.get('msg_rate'),0)} | {fmt(r.get('lat_p50_us'))} | {fmt(r.get('lat_p99_us'))} | {fmt(r.get('lat_p999_us'))} |")
EOF
echo
echo "Commands: \`$RDMX perf --layer rpc --local --test lat|rate --size $SIZE [--rpc-threads 0|2] [--rpc-depth 64] [--busy-poll] --json\`,"
echo "\`$RDMX perf --layer msg --local --test lat --size $SIZE [--busy-poll] --json\`, \`$TONIC bench --local --size $SIZE --secs $TONIC_SECS --depth 1|64 --json\`."
