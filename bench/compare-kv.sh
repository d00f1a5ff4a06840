#!/usr/bin/env bash
# compare-kv.sh: the rdmx-kv demo against Redis (redis-benchmark) and memcached (memcaslap)
# on this machine, in one run; prints a markdown report.
#
# Usage:  bench/compare-kv.sh > results.md        (progress goes to stderr)
#
# GETs of 64-byte values on 10,000 keys drawn uniformly (what redis-benchmark -r draws), REPS
# times each, interleaved (medians shown, and the median of the per-rep ratios):
#   1 client, one at a time: rdmx-kv one-sided and through RPC, blocking and busy-polling
#     (RDMX_BUSY_POLL_US=1000000); redis-benchmark -c 1 -P 1; memcaslap -T 1 -c 1;
#   50 clients: rdmx-kv one-sided and RPC (50 connections on one context driven by 2 threads,
#     as redis-benchmark drives its connections from its event loop: a wave's reads are all
#     posted, its RPC calls sent in one batch); redis -c 50, with its one
#     thread and with --threads 2 (the ratio is taken against the better); memcaslap -T 2 -c 50;
#   16 in flight: rdmx-kv --depth 16 through RPC; redis -P 16.
#
# Knobs: REPS=3 SECS=4 (rdmx and memcached runs) N=200000 (redis requests per run)
#   SKIP_BUILD=1 KEEP_LOGS=1. Installs redis-server, redis-tools, memcached,
#   libmemcached-tools when missing and root. No pinning: 2 CPUs shared by both sides.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPS=${REPS:-3}
SECS=${SECS:-4}
N=${N:-200000}
KV="$ROOT/target/release/rdmx-kv"
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/compare-kv.XXXXXX")
RESULTS="$LOGDIR/results.tsv"
: >"$RESULTS"
REDIS_PORT=16401
MC_PORT=16501

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
cleanup() {
    [[ -n "${REDIS_UP:-}" ]] && redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    pkill -f "memcached -p $MC_PORT" 2>/dev/null || true
    if [[ "${KEEP_LOGS:-0}" == 1 ]]; then log "logs kept in $LOGDIR"; else rm -rf "$LOGDIR"; fi
}
trap cleanup EXIT

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v memcached >/dev/null || need+=(memcached)
command -v memcaslap >/dev/null || need+=(libmemcached-tools)
if ((${#need[@]})) && [[ $(id -u) == 0 ]]; then
    log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || true
fi

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    log "building rdmx-kv"
    (cd "$ROOT" && cargo build --release -p rdmx-kv) >"$LOGDIR/build.log" 2>&1 ||
        { tail -n 20 "$LOGDIR/build.log" >&2; exit 1; }
fi

HAVE_REDIS=0
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes >/dev/null
    REDIS_UP=1
    sleep 0.5
    # The keys the GETs read.
    redis-benchmark -p "$REDIS_PORT" -t set -d 64 -r 10000 -n 100000 -q >/dev/null
    HAVE_REDIS=1
fi
HAVE_MC=0
if command -v memcached >/dev/null && command -v memcaslap >/dev/null; then
    memcached -p "$MC_PORT" -l 127.0.0.1 -U 0 -t 2 -d -u "$(id -un)" -P "$LOGDIR/mc.pid"
    printf 'key\n16 16 1\nvalue\n64 64 1\ncmd\n0 0.0\n1 1.0\n' >"$LOGDIR/mc.cfg"
    sleep 0.3
    HAVE_MC=1
fi

# record NAME REP VALUE(ops/s) P50_US
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$RESULTS"; log "  $1: $3 ops/s p50 ${4:-n/a} us"; }

kv() { # NAME REP ARGS...
    local name=$1 rep=$2
    shift 2
    local out
    if out=$(timeout 120 "$KV" bench --local --workload c --dist uniform --keys 10000 --value-size 64 --secs "$SECS" --json "$@" 2>>"$LOGDIR/$name.err"); then
        record "$name" "$rep" "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round(d["get_stats"]["ops_per_s"]))' "$out")" \
            "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["get_stats"]["p50_us"])' "$out")"
    else
        log "  $name: failed"
    fi
}
redis() { # NAME REP CLIENTS PIPELINE [THREADS]
    local line threads=()
    [[ -n "${5:-}" ]] && threads=(--threads "$5")
    line=$(redis-benchmark -p "$REDIS_PORT" -t get -d 64 -r 10000 -n "$N" -c "$3" -P "$4" "${threads[@]}" --csv 2>/dev/null | grep '"GET"') || { log "  $1: failed"; return; }
    record "$1" "$2" "$(echo "$line" | cut -d, -f2 | tr -d '"' | cut -d. -f1)" "$(echo "$line" | cut -d, -f5 | tr -d '"' | awk '{print $1 * 1000}')"
}
mc() { # NAME REP THREADS CONCURRENCY
    local tps
    tps=$(timeout 60 memcaslap -s "127.0.0.1:$MC_PORT" -T "$3" -c "$4" -t "${SECS}s" -F "$LOGDIR/mc.cfg" 2>&1 | awk '/^Run time/ {for (i = 1; i <= NF; i++) if ($i == "TPS:") print $(i + 1)}' | tail -1)
    [[ -n "$tps" ]] && record "$1" "$2" "$tps" || log "  $1: failed"
}

for rep in $(seq 1 "$REPS"); do
    log "rep $rep/$REPS"
    kv kv1_onesided "$rep"
    RDMX_BUSY_POLL_US=1000000 kv kv1_onesided_busy "$rep"
    kv kv1_rpc "$rep" --get rpc
    RDMX_BUSY_POLL_US=1000000 kv kv1_rpc_busy "$rep" --get rpc
    ((HAVE_REDIS)) && redis redis1 "$rep" 1 1
    ((HAVE_MC)) && mc mc1 "$rep" 1 1
    kv kv50_onesided "$rep" --clients 50 --threads 2
    kv kv50_rpc "$rep" --clients 50 --threads 2 --get rpc
    ((HAVE_REDIS)) && redis redis50 "$rep" 50 1
    ((HAVE_REDIS)) && redis redis50t2 "$rep" 50 1 2
    ((HAVE_MC)) && mc mc50 "$rep" 2 50
    kv kvP16_rpc "$rep" --get rpc --depth 16
    ((HAVE_REDIS)) && redis redisP16 "$rep" 1 16
done

echo "# KV GET: rdmx-kv vs Redis vs memcached, same machine, same run"
echo
echo "* date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); git $(git -C "$ROOT" rev-parse --short HEAD)"
echo "* CPUs: $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); no pinning; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "* $(redis-server --version 2>/dev/null | cut -d' ' -f1-3); memcached $(memcached -V 2>/dev/null | cut -d' ' -f2)"
echo "* GETs of 64-byte values, 10,000 keys drawn uniformly; $REPS repetitions, interleaved; medians"
echo
python3 - "$RESULTS" <<'EOF'
import statistics as st, sys
from collections import defaultdict
runs = defaultdict(dict)
for line in open(sys.argv[1]):
    name, rep, ops, p50 = (line.rstrip("\n").split("\t") + [""])[:4]
    runs[name][int(rep)] = (float(ops), float(p50) if p50 else None)
def med(n, i=0):
    v = [r[i] for r in runs.get(n, {}).values() if r[i] is not None]
    return st.median(v) if v else None
def ratio(a, b):
    # Against the better Redis run of the rep when there are two configurations.
    bs = [b] + ([b + "t2"] if b + "t2" in runs else [])
    reps = sorted(set(runs.get(a, {})).intersection(*[set(runs[x]) for x in bs if x in runs]))
    v = []
    for r in reps:
        best = max(runs[x][r][0] for x in bs if x in runs)
        if best:
            v.append(runs[a][r][0] / best)
    return st.median(v) if v else None
f = lambda x, d=0: "n/a" if x is None else f"{x:,.{d}f}"
rows = [
    ("1 client, one-sided GET, blocking", "kv1_onesided", "redis1"),
    ("1 client, one-sided GET, busy-polling", "kv1_onesided_busy", "redis1"),
    ("1 client, GET through RPC, blocking", "kv1_rpc", "redis1"),
    ("1 client, GET through RPC, busy-polling", "kv1_rpc_busy", "redis1"),
    ("50 clients, one-sided GET (2 client threads)", "kv50_onesided", "redis50"),
    ("50 clients, GET through RPC (2 client threads)", "kv50_rpc", "redis50"),
    ("16 in flight, GET through RPC (Redis -P 16)", "kvP16_rpc", "redisP16"),
]
mc = {"redis1": "mc1", "redis50": "mc50", "redisP16": None}
print("| GET, 64 B | rdmx-kv ops/s (p50 us) | Redis ops/s (p50 us) | memcached ops/s | rdmx / Redis (paired) |")
print("| --- | ---: | ---: | ---: | ---: |")
for label, a, b in rows:
    m = mc[b]
    redis = f"{f(med(b))} ({f(med(b, 1), 1)})"
    if b + "t2" in runs:
        redis += f"; --threads 2: {f(med(b + 't2'))} ({f(med(b + 't2', 1), 1)})"
    print(f"| {label} | {f(med(a))} ({f(med(a, 1), 1)}) | {redis} | {f(med(m)) if m else 'n/a'} | {f(ratio(a, b), 2)} |")
print()
print("## Runs")
print()
for n in sorted(runs):
    print(f"* {n}: " + ", ".join(f"{f(runs[n][r][0])}" for r in sorted(runs[n])))
EOF
