#!/usr/bin/env bash
# compare-pubsub.sh: measure rdmx multicast groups (`rdmx perf --layer mcast --local`)
# against pub/sub through Redis and NATS (bench/pubsub-compare, which measures them the same
# way over loopback TCP), on this machine, in the same run, and print a markdown report.
#
# Usage:  bench/compare-pubsub.sh > results.md        (progress goes to stderr)
#
# What is measured, for sizes 8 and 256 B and 1 and 3 subscribers, REPS times each
# (interleaved: every system's run of one configuration comes seconds after the others'):
#   rate  COUNT messages published as fast as the system takes them; each subscriber's
#         msg/s from its first message to its last (the tables show the slowest one's)
#   lat   LAT_COUNT messages at LAT_RATE msg/s; publish-to-deliver latency p50/p99/p99.9
#         over all subscribers' messages (the clocks of processes on one host agree)
# Every message carries its publish time (ns since the Unix epoch) in its first 8 bytes.
#   rdmx   one publisher process and N subscriber processes of a reliable group
#   redis  redis-server (single-threaded), PUBLISH/SUBSCRIBE over RESP, N subscriber
#          connections (threads of one pubsub-compare process) and one publisher connection
#   nats   nats-server, PUB/SUB over the NATS text protocol, the same way
# Fan-out: the slowest subscriber's rate with 3 subscribers against 1 (1.00 = each
# subscriber still gets everything at the single-subscriber rate).
#
# Environment knobs (all optional):
#   REPS=3                 repetitions (the tables show the median)
#   COUNT=200000           messages per rate run
#   LAT_RATE=20000         messages per second in the lat runs
#   LAT_COUNT=20000        messages per lat run
#   SIZES="8 256"          message sizes (bytes, >= 8)
#   RUN_TIMEOUT=180        seconds before one run is killed (timeout(1))
#   PAUSE=0                seconds to sleep between runs (lets a busy machine settle)
#   PORT_BASE=16379        first TCP port tried for redis-server and nats-server
#   SKIP_BUILD=1           use an existing target/release/rdmx instead of building it
#   SKIP_REDIS=1 / SKIP_NATS=1   leave Redis / NATS out
#   KEEP_LOGS=1            keep the per-run logs (their directory is printed)
#
# redis-server and nats-server are installed with apt-get when missing and this runs as
# root; otherwise their columns are n/a. Both are started here on free loopback ports and
# stopped on exit: redis-server --save '' --appendonly no (nothing written to disk) and
# --client-output-buffer-limit 'pubsub 0 0 0' (a subscriber that falls behind is buffered,
# not disconnected); nats-server with its defaults (it drops a slow consumer: such messages
# show as missing). Nothing is pinned: on a 2-CPU machine the publisher, the subscribers and
# the server share both CPUs, which the fan-out rows reflect.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPS=${REPS:-3}
COUNT=${COUNT:-200000}
LAT_RATE=${LAT_RATE:-20000}
LAT_COUNT=${LAT_COUNT:-20000}
read -r -a SIZE_LIST <<<"${SIZES:-8 256}"
SUB_LIST=(1 3)
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
PAUSE=${PAUSE:-0}
NEXT_PORT=${PORT_BASE:-16379}
RDMX="$ROOT/target/release/rdmx"
PSC_DIR="$ROOT/bench/pubsub-compare"
PSC="$PSC_DIR/target/release/pubsub-compare"
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/compare-pubsub.XXXXXX")
RUNS="$LOGDIR/runs.tsv" # system test size subs rep log exit-status, one run a line
: >"$RUNS"

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

SERVER_PIDS=()
cleanup() {
    local pid
    for pid in "${SERVER_PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ "${KEEP_LOGS:-0}" == 1 ]]; then
        log "logs kept in $LOGDIR"
    else
        rm -rf "$LOGDIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------- setup --
USE_REDIS=1
USE_NATS=1
[[ "${SKIP_REDIS:-0}" == 1 ]] && USE_REDIS=0
[[ "${SKIP_NATS:-0}" == 1 ]] && USE_NATS=0
missing_pkgs=()
((USE_REDIS)) && ! command -v redis-server >/dev/null 2>&1 && missing_pkgs+=(redis-server)
((USE_NATS)) && ! command -v nats-server >/dev/null 2>&1 && missing_pkgs+=(nats-server)
if ((${#missing_pkgs[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "installing ${missing_pkgs[*]} (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -q && apt-get install -y -q "${missing_pkgs[@]}"; } \
            >"$LOGDIR/apt.log" 2>&1 || log "apt-get failed (see $LOGDIR/apt.log)"
    else
        log "missing: ${missing_pkgs[*]} (not root or no apt-get: not installing)"
    fi
fi
if ((USE_REDIS)) && ! command -v redis-server >/dev/null 2>&1; then
    log "redis-server unavailable: redis columns will be n/a"
    USE_REDIS=0
fi
if ((USE_NATS)) && ! command -v nats-server >/dev/null 2>&1; then
    log "nats-server unavailable: nats columns will be n/a"
    USE_NATS=0
fi

build_rdmx
log "building pubsub-compare (cargo build --release --manifest-path bench/pubsub-compare/Cargo.toml)"
if ! cargo build --release --manifest-path "$PSC_DIR/Cargo.toml" >"$LOGDIR/build-psc.log" 2>&1; then
    tail -n 20 "$LOGDIR/build-psc.log" >&2 || true
    log "building pubsub-compare failed"
    exit 1
fi

# start_server NAME PORT CMD... -> starts CMD in the background, waits until PORT listens;
# false (and the server stopped) when it does not within 10 s.
start_server() {
    local name=$1 port=$2 pid waited=0
    shift 2
    "$@" >"$LOGDIR/$name.log" 2>&1 &
    pid=$!
    SERVER_PIDS+=("$pid")
    until port_listening "$port"; do
        if ! kill -0 "$pid" 2>/dev/null || ((waited >= 200)); then
            log "$name did not start on port $port:"
            tail -n 5 "$LOGDIR/$name.log" >&2 || true
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            return 1
        fi
        sleep 0.05
        waited=$((waited + 1))
    done
    log "$name listening on 127.0.0.1:$port (pid $pid)"
}

REDIS_PORT=n/a
NATS_PORT=n/a
if ((USE_REDIS)); then
    next_free_port
    REDIS_PORT=$PORT
    start_server redis-server "$REDIS_PORT" redis-server --port "$REDIS_PORT" \
        --bind 127.0.0.1 --save '' --appendonly no \
        --client-output-buffer-limit 'pubsub 0 0 0' --daemonize no || USE_REDIS=0
fi
if ((USE_NATS)); then
    next_free_port
    NATS_PORT=$PORT
    start_server nats-server "$NATS_PORT" nats-server -a 127.0.0.1 -p "$NATS_PORT" || USE_NATS=0
fi

# ------------------------------------------------------------------------------ measure --
# run_one SYSTEM TEST SIZE SUBS REP: one run, its JSON line left in its log, a line in RUNS.
run_one() {
    local sys=$1 test=$2 size=$3 subs=$4 rep=$5 rc=0
    local out="$LOGDIR/$sys-$test-$size-$subs-$rep"
    local iters=$COUNT
    [[ $test == lat ]] && iters=$LAT_COUNT
    local -a cmd
    case $sys in
    rdmx)
        cmd=("$RDMX" perf --layer mcast --local --test "$test" --subs "$subs" --size "$size"
            --iters "$iters" --json)
        [[ $test == lat ]] && cmd+=(--mcast-rate "$LAT_RATE")
        ;;
    redis | nats)
        local port=$REDIS_PORT
        [[ $sys == nats ]] && port=$NATS_PORT
        cmd=("$PSC" "$sys" --port "$port" --subs "$subs" --size "$size" --count "$iters" --json)
        [[ $test == lat ]] && cmd+=(--rate "$LAT_RATE")
        ;;
    esac
    timeout "$RUN_TIMEOUT" "${cmd[@]}" >"$out" 2>"$out.err" || rc=$?
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$test" "$size" "$subs" "$rep" "$out" "$rc" \
        >>"$RUNS"
    local got
    got=$(grep -o '"min_sub_msgs_per_s":[^,]*,"lat_p50_us":[^,]*' "$out" 2>/dev/null |
        tail -n 1 | sed 's/"min_sub_msgs_per_s":/slowest sub msg\/s /; s/,"lat_p50_us":/, p50 us /' ||
        true)
    if ((rc != 0)); then
        log "  $sys $test $size B x$subs: exit $rc${got:+ ($got)}; $(tail -n 1 "$out.err" 2>/dev/null)"
    else
        log "  $sys $test $size B x$subs: ${got:-no result}"
    fi
    if [[ $PAUSE != 0 ]]; then sleep "$PAUSE"; fi
}

SYSTEMS=(rdmx)
((USE_REDIS)) && SYSTEMS+=(redis)
((USE_NATS)) && SYSTEMS+=(nats)
START=$(date +%s)
for ((rep = 1; rep <= REPS; rep++)); do
    for size in "${SIZE_LIST[@]}"; do
        for subs in "${SUB_LIST[@]}"; do
            for test in rate lat; do
                log "rep $rep/$REPS: $test, $size B, $subs subscriber(s)"
                for sys in "${SYSTEMS[@]}"; do
                    run_one "$sys" "$test" "$size" "$subs" "$rep"
                done
            done
        done
    done
done
ELAPSED=$(($(date +%s) - START))

# ------------------------------------------------------------------------------- report --
cpu_model=$(awk -F: '/^model name/ { sub(/^[ \t]+/, "", $2); print $2; exit }' /proc/cpuinfo 2>/dev/null)
rdmx_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
if ! git -C "$ROOT" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude)bench' 2>/dev/null; then
    rdmx_rev="$rdmx_rev + uncommitted changes"
fi
redis_version=n/a
nats_version=n/a
if command -v redis-server >/dev/null 2>&1; then
    redis_version=$(redis-server --version 2>/dev/null | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^v=/) print substr($i, 3) }')
fi
if command -v nats-server >/dev/null 2>&1; then
    nats_version=$(nats-server --version 2>/dev/null | awk '{ print $NF }')
fi

echo "# Pub/sub: rdmx multicast groups vs Redis vs NATS, same machine, same run"
echo
echo "* date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); kernel: $(uname -r)"
echo "* CPUs (nproc): $(nproc); CPU model: ${cpu_model:-unknown}"
echo "* uptime at the end: $(uptime | sed 's/^ *//')"
echo "* pinning: none. The publisher, the subscribers and the server share the $(nproc) CPU(s);"
echo "  with 3 subscribers there are more busy threads than CPUs here."
echo "* rdmx: $RDMX (git $rdmx_rev), \`rdmx perf --layer mcast --local\` (reliable group,"
echo "  subscribers are processes)"
echo "* redis-server $redis_version$( ((USE_REDIS)) || echo ' (not run)'); nats-server $nats_version$( ((USE_NATS)) || echo ' (not run)')"
echo "  via bench/pubsub-compare (loopback TCP, subscribers are threads of one process)"
echo "* rate runs: $COUNT messages as fast as possible; lat runs: $LAT_COUNT messages at"
echo "  $LAT_RATE msg/s; repetitions: $REPS (medians shown); measuring took ${ELAPSED}s"
echo
REPS=$REPS COUNT=$COUNT LAT_RATE=$LAT_RATE python3 - "$RUNS" <<'PY'
import json, os, statistics, sys

runs = []  # (system, test, size, subs, rep, report dict or None, exit status)
with open(sys.argv[1]) as f:
    for line in f:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 7:
            continue
        sys_, test, size, subs, rep, path, rc = parts
        row = None
        try:
            with open(path, errors="replace") as out:
                for l in out:
                    l = l.strip()
                    if not l.startswith("{"):
                        continue
                    try:
                        obj = json.loads(l)
                    except ValueError:
                        continue
                    if isinstance(obj, dict) and "min_sub_msgs_per_s" in obj:
                        row = obj
        except OSError:
            pass
        runs.append((sys_, test, int(size), int(subs), int(rep), row, rc))

SYSTEMS = ["rdmx", "redis", "nats"]
configs = []
for r in runs:
    key = (r[1], r[2], r[3])
    if key not in configs:
        configs.append(key)
configs.sort(key=lambda k: (0 if k[0] == "rate" else 1, k[1], k[2]))

def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v

def values(sys_, test, size, subs, field):
    out = []
    for r in runs:
        if r[:4] == (sys_, test, size, subs) and r[5] is not None and num(r[5].get(field)):
            out.append(float(r[5][field]))
    return out

def med(sys_, test, size, subs, field):
    v = values(sys_, test, size, subs, field)
    return statistics.median(v) if v else None

def missing(sys_, test, size, subs):
    tot, seen = 0, False
    for r in runs:
        if r[:4] == (sys_, test, size, subs) and r[5] is not None:
            m = r[5].get("missing")
            if isinstance(m, list):
                seen = True
                tot += sum(x for x in m if num(x))
    return tot if seen else None

def fmt(v, digits):
    if v is None:
        return "n/a"
    return f"{v:.{digits}f}"

def ratio(a, b):
    if a is None or b in (None, 0):
        return "n/a"
    r = a / b
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"

rate = os.environ.get("LAT_RATE", "?")
print("## Medians per configuration")
print()
print("msg/s: messages per second (the slowest subscriber's, from its first message to its")
print("last; the publisher's until everything was taken). Latency: publish to deliver, us,")
print("nearest rank over all subscribers' messages. Ratios are rdmx / the other system's")
print("median: above 1 is more for rdmx (good for msg/s, bad for latency).")
print()
print("| test | size | subs | measure | rdmx | redis | nats | rdmx/redis | rdmx/nats |")
print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
rows = [
    ("slowest subscriber msg/s", "min_sub_msgs_per_s", 0, True),
    ("publisher msg/s", "pub_msgs_per_s", 0, False),
    ("latency p50 (us)", "lat_p50_us", 1, True),
    ("latency p99 (us)", "lat_p99_us", 1, True),
    ("latency p99.9 (us)", "lat_p999_us", 1, True),
]
for test, size, subs in configs:
    label = "rate" if test == "rate" else f"lat @ {rate}/s"
    for name, field, digits, with_ratio in rows:
        m = {s: med(s, test, size, subs, field) for s in SYSTEMS}
        cells = [fmt(m[s], digits) for s in SYSTEMS]
        r1 = ratio(m["rdmx"], m["redis"]) if with_ratio else ""
        r2 = ratio(m["rdmx"], m["nats"]) if with_ratio else ""
        print(f"| {label} | {size} | {subs} | {name} | " + " | ".join(cells) + f" | {r1} | {r2} |")
    miss = [missing(s, test, size, subs) for s in SYSTEMS]
    print(f"| {label} | {size} | {subs} | messages missing (all reps) | "
          + " | ".join("n/a" if x is None else str(int(x)) for x in miss) + " | | |")

print()
print("## Fan-out (rate runs)")
print()
print("The slowest subscriber's msg/s with 3 subscribers / with 1 (medians); 1.00 means every")
print("subscriber still gets the single-subscriber rate.")
print()
print("| size | rdmx | redis | nats |")
print("| ---: | ---: | ---: | ---: |")
sizes = sorted({c[1] for c in configs if c[0] == "rate"})
for size in sizes:
    cells = [ratio(med(s, "rate", size, 3, "min_sub_msgs_per_s"),
                   med(s, "rate", size, 1, "min_sub_msgs_per_s")) for s in SYSTEMS]
    print(f"| {size} | " + " | ".join(cells) + " |")

print()
print("## Details (every run)")
print()
print("| system | test | size | subs | rep | exit | pub msg/s | slowest sub msg/s | p50 | p99 | p99.9 | max (us) | missing |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for sys_, test, size, subs, rep, row, rc in runs:
    if row is None:
        print(f"| {sys_} | {test} | {size} | {subs} | {rep} | {rc} | n/a | n/a | n/a | n/a | n/a | n/a | n/a |")
        continue
    g = lambda k, d: fmt(float(row[k]), d) if num(row.get(k)) else "n/a"
    miss = row.get("missing")
    miss = ",".join(str(x) for x in miss) if isinstance(miss, list) else "n/a"
    print(f"| {sys_} | {test} | {size} | {subs} | {rep} | {rc} | {g('pub_msgs_per_s', 0)} | "
          f"{g('min_sub_msgs_per_s', 0)} | {g('lat_p50_us', 1)} | {g('lat_p99_us', 1)} | "
          f"{g('lat_p999_us', 1)} | {g('lat_max_us', 1)} | {miss} |")
PY
echo
echo "rdmx's publisher msg/s counts until every subscriber had every message (the group's"
echo "flush); pubsub-compare's until the server acknowledged the last one (Redis: the reply to"
echo "the last PUBLISH; NATS: the PONG to a PING after the last PUB)."
echo
echo "## Commands"
echo
echo '```'
echo "redis-server --port REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no --client-output-buffer-limit 'pubsub 0 0 0' --daemonize no"
echo "nats-server -a 127.0.0.1 -p NATS_PORT"
echo "# per size S in ${SIZE_LIST[*]} and N in ${SUB_LIST[*]}, each under timeout $RUN_TIMEOUT"
echo "target/release/rdmx perf --layer mcast --local --test rate --subs N --size S --iters $COUNT --json"
echo "target/release/rdmx perf --layer mcast --local --test lat --mcast-rate $LAT_RATE --subs N --size S --iters $LAT_COUNT --json"
echo "bench/pubsub-compare/target/release/pubsub-compare {redis --port REDIS_PORT|nats --port NATS_PORT} --subs N --size S --count $COUNT --json"
echo "bench/pubsub-compare/target/release/pubsub-compare {redis --port REDIS_PORT|nats --port NATS_PORT} --subs N --size S --count $LAT_COUNT --rate $LAT_RATE --json"
echo '```'
