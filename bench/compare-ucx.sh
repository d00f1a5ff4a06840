#!/usr/bin/env bash
# compare-ucx.sh: measure `rdmx perf` side by side with UCX's ucx_perftest over TCP
# (UCX_TLS=tcp) on this machine, in the same run, and print a markdown report.
#
# Usage:  bench/compare-ucx.sh > results.md        (progress goes to stderr)
#
# Environment knobs (all optional):
#   SIZES="8 4096 65536 1048576"   message sizes in bytes
#   REPS=5                         repetitions of every measurement; the table shows the median
#   UCX_PORT_BASE=13337            first TCP port tried for ucx_perftest's side channel
#   UCX_NET_DEVICES=lo             UCX network device(s); lo keeps UCX on loopback like rdmx
#                                  (with both lo and eth0 UCX stripes large messages over two
#                                  TCP lanes)
#   UCX_PIN=1                      pin the ucx_perftest server to CPU 0 and the client to CPU 1
#                                  (when there are >= 2 CPUs). Unpinned, the two busy-polling
#                                  processes sometimes share a CPU until the scheduler separates
#                                  them, and a ping-pong then costs a 4 ms scheduler tick per
#                                  iteration for thousands of iterations.
#   SKIP_UCX=1 / SKIP_RDMX=1       leave one side out (its columns print n/a)
#   SKIP_BUILD=1                   use an existing target/release/rdmx instead of building
#   KEEP_LOGS=1                    keep the per-run logs (their directory is printed)
#
# Both tools busy-poll. ucx_perftest's tag_lat is a ping-pong that already reports one-way
# latency (round trip / 2), as does rdmx's send_lat. UCX prints MB/s as 2^20 bytes per second
# and rdmx as 10^6 bytes per second; the summary table converts UCX's to 10^6.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
read -r -a SIZES <<<"${SIZES:-8 4096 65536 1048576}"
REPS=${REPS:-5}
NEXT_PORT=${UCX_PORT_BASE:-13337}
UCX_DEVICES=${UCX_NET_DEVICES:-lo}
UCX_SERVER_PIN=()
UCX_CLIENT_PIN=()
if [[ "${UCX_PIN:-1}" == 1 ]] && (($(nproc) >= 2)); then
    UCX_SERVER_PIN=(-c 0)
    UCX_CLIENT_PIN=(-c 1)
fi
RDMX="$ROOT/target/release/rdmx"
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/compare-ucx.XXXXXX")

cleanup() {
    if [[ "${KEEP_LOGS:-0}" == 1 ]]; then
        log "logs kept in $LOGDIR"
    else
        rm -rf "$LOGDIR"
    fi
}
trap cleanup EXIT

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

# Iteration counts: large enough to be stable, small enough that the whole script (build
# included) stays within a few minutes on a 2-core machine.
lat_iters() {
    case $1 in
        8 | 4096) echo 20000 ;;
        65536) echo 5000 ;;
        *) echo 500 ;;
    esac
}
bw_iters() {
    case $1 in
        8) echo 100000 ;;
        4096) echo 50000 ;;
        65536) echo 10000 ;;
        *) echo 1000 ;;
    esac
}

# ---------------------------------------------------------------------------------- setup --
HAVE_UCX=0
if [[ "${SKIP_UCX:-0}" != 1 ]]; then
    if ! command -v ucx_perftest >/dev/null 2>&1; then
        log "ucx_perftest not found: installing ucx-utils"
        if command -v apt-get >/dev/null 2>&1; then
            export DEBIAN_FRONTEND=noninteractive
            { apt-get update -q && apt-get install -y -q ucx-utils; } >"$LOGDIR/apt.log" 2>&1 ||
                log "apt-get failed (see $LOGDIR/apt.log)"
        fi
    fi
    command -v ucx_perftest >/dev/null 2>&1 && HAVE_UCX=1
    ((HAVE_UCX)) || log "ucx_perftest unavailable: UCX columns will be n/a"
fi

HAVE_RDMX=0
if [[ "${SKIP_RDMX:-0}" != 1 ]]; then
    built=1
    if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
        log "building rdmx (cargo build --release -p rdmx-tools)"
        if ! (cd "$ROOT" && cargo build --release -p rdmx-tools) >"$LOGDIR/build.log" 2>&1; then
            built=0 # a binary left over from an older build would not measure this tree
            log "cargo build failed (tail of the log follows); rdmx columns will be n/a"
            tail -n 20 "$LOGDIR/build.log" >&2 || true
        fi
    fi
    ((built)) && [[ -x "$RDMX" ]] && HAVE_RDMX=1
    ((HAVE_RDMX)) || log "rdmx not measured: rdmx columns will be n/a"
fi

# ------------------------------------------------------------------------------- runners --
# Each runner sets RESULT to one line of numbers (empty on failure); raw output goes to a log.
# (They run in the main shell, not in $(...), so that NEXT_PORT advances.)

# ucx_perftest prints its final result as
#   Final: <iters> <lat 50%ile> <lat avg> <lat overall> <MB/s avg> <MB/s overall> <msg/s avg> <msg/s overall>
# (latency columns are in usec; for tag_bw they are the per-message send overhead).
# run_ucx TEST SIZE ITERS LOG -> RESULT="p50 lat_overall bw_overall msgrate_overall"
run_ucx() {
    local test=$1 size=$2 iters=$3 out=$4 spid waited=0
    RESULT=
    next_free_port
    env UCX_TLS=tcp UCX_NET_DEVICES="$UCX_DEVICES" timeout 60 ucx_perftest -p "$PORT" \
        "${UCX_SERVER_PIN[@]}" >"$out.server" 2>&1 &
    spid=$!
    until port_listening "$PORT"; do
        if ! kill -0 "$spid" 2>/dev/null || ((waited >= 100)); then
            log "ucx_perftest server on port $PORT did not start"
            kill "$spid" 2>/dev/null || true
            wait "$spid" 2>/dev/null || true
            return 0
        fi
        sleep 0.05
        waited=$((waited + 1))
    done
    env UCX_TLS=tcp UCX_NET_DEVICES="$UCX_DEVICES" timeout 60 ucx_perftest 127.0.0.1 \
        -p "$PORT" "${UCX_CLIENT_PIN[@]}" -t "$test" -s "$size" -n "$iters" \
        -w "$(warmup_of "$iters")" >"$out" 2>&1 || log "ucx_perftest $test -s $size failed (exit $?)"
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    RESULT=$(awk '$1 == "Final:" && NF == 9 { line = $3 " " $5 " " $7 " " $9 }
        END { if (line != "") print line }' "$out")
}

# `rdmx perf --json` prints one JSON object per result line with the keys test, size, iters,
# lat_p50_us, lat_p99_us, bw_MBps, msg_rate.
# run_rdmx TEST SIZE ITERS LOG -> RESULT="p50 p99 bw msgrate" (n/a for missing fields)
run_rdmx() {
    local test=$1 size=$2 iters=$3 out=$4
    RESULT=
    if ((${#UCX_SERVER_PIN[@]})) && command -v taskset >/dev/null; then
        # Pinned like the UCX runs: server on CPU 0, client on CPU 1.
        local srv port="" waited=0
        taskset -c 0 timeout 150 "$RDMX" perf --server --once --port 0 --print-port --busy-poll \
            >"$out.server" 2>&1 &
        srv=$!
        while [[ -z "$port" ]] && ((waited < 100)); do
            port=$({ head -n 1 "$out.server" 2>/dev/null || true; } | tr -dc '0-9')
            [[ -n "$port" ]] || { sleep 0.05; waited=$((waited + 1)); }
        done
        taskset -c 1 timeout 120 "$RDMX" perf --connect "127.0.0.1:$port" --test "$test" \
            --size "$size" --iters "$iters" --busy-poll --json >"$out" 2>&1 ||
            log "rdmx perf --test $test --size $size failed (exit $?)"
        kill "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
    else
        timeout 120 "$RDMX" perf --local --test "$test" --size "$size" --iters "$iters" \
            --busy-poll --json >"$out" 2>&1 || log "rdmx perf --test $test --size $size failed (exit $?)"
    fi
    RESULT=$(python3 - "$out" "$size" <<'PY' || true
import json, sys
row = None
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        try:
            same_size = int(obj.get("size")) == int(sys.argv[2])
        except (TypeError, ValueError):
            same_size = False
        if same_size:
            row = obj
if row is not None:
    def num(key, digits):
        v = row.get(key)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
        return "%.*f" % (digits, v) if ok else "n/a"
    print(num("lat_p50_us", 3), num("lat_p99_us", 3), num("bw_MBps", 2), num("msg_rate", 0))
PY
)
}

# ------------------------------------------------------------------------------ measure --
declare -A VALS # key "tool/test/size/field" -> values of all reps, space separated
RAW=()          # raw rows for the details table

record() { # record TOOL TEST SIZE REP "v1 v2 v3 v4" NAME1 NAME2 NAME3 NAME4
    local tool=$1 test=$2 size=$3 rep=$4 line=$5
    shift 5
    local -a v names=("$@")
    read -r -a v <<<"$line"
    local i row="| $tool | $test | $size | $rep |"
    for i in "${!names[@]}"; do
        local x=${v[$i]:-n/a}
        VALS["$tool/$test/$size/${names[$i]}"]+="$x "
        row+=" $x |"
    done
    RAW+=("$row")
}

START=$(date +%s)
for ((rep = 1; rep <= REPS; rep++)); do
    for size in "${SIZES[@]}"; do
        li=$(lat_iters "$size")
        bi=$(bw_iters "$size")
        if ((HAVE_UCX)); then
            log "rep $rep/$REPS size $size: ucx tag_lat, tag_bw"
            run_ucx tag_lat "$size" "$li" "$LOGDIR/ucx-lat-$size-$rep"
            record ucx tag_lat "$size" "$rep" "$RESULT" p50 avg bw rate
            run_ucx tag_bw "$size" "$bi" "$LOGDIR/ucx-bw-$size-$rep"
            record ucx tag_bw "$size" "$rep" "$RESULT" p50 avg bw rate
        fi
        if ((HAVE_RDMX)); then
            log "rep $rep/$REPS size $size: rdmx send_lat, send_bw, write_bw"
            for t in send_lat send_bw write_bw; do
                n=$li
                [[ $t == send_lat ]] || n=$bi
                run_rdmx "$t" "$size" "$n" "$LOGDIR/rdmx-$t-$size-$rep"
                record rdmx "$t" "$size" "$rep" "$RESULT" p50 p99 bw rate
            done
        fi
    done
done
ELAPSED=$(($(date +%s) - START))


# ------------------------------------------------------------------------------- report --
cpu_model=$(awk -F: '/^model name/ { sub(/^[ \t]+/, "", $2); print $2; exit }' /proc/cpuinfo 2>/dev/null)
ucx_version=n/a
if ((HAVE_UCX)); then
    ucx_version=$(ucx_info -v 2>/dev/null | awk '/Version/ { print $NF; exit }')
    pkg=$(dpkg-query -W -f='${Version}' ucx-utils 2>/dev/null || true)
    [[ -n "$pkg" ]] && ucx_version="$ucx_version (Debian ucx-utils $pkg)"
fi
rdmx_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")

echo "# rdmx perf vs UCX ucx_perftest (TCP), same machine, same run"
echo
echo "* date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "* kernel: $(uname -r); CPUs: $(nproc); CPU model: ${cpu_model:-unknown}"
echo "* load average at the end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
pinned="not pinned"
((${#UCX_SERVER_PIN[@]})) && pinned="server pinned to CPU 0, client to CPU 1"
echo "* ucx_perftest: UCX ${ucx_version:-unknown}, UCX_TLS=tcp, UCX_NET_DEVICES=$UCX_DEVICES, $pinned"
if ((HAVE_RDMX)); then
    echo "* rdmx: $RDMX (git $rdmx_rev), server pinned to CPU 0 and client to CPU 1 like UCX (taskset), else --local unpinned"
else
    echo "* rdmx: not measured (build failed, binary missing or SKIP_RDMX=1)"
fi
echo "* repetitions: $REPS (median shown); measuring took ${ELAPSED}s"
echo
echo "| size | UCX tag_lat (us) | rdmx send_lat p50 (us) | UCX tag_bw (MB/s) | UCX msg rate | rdmx send_bw (MB/s) | rdmx msg rate | rdmx write_bw (MB/s) |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for size in "${SIZES[@]}"; do
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$size" \
        "$(median "ucx/tag_lat/$size/p50" 2)" \
        "$(median "rdmx/send_lat/$size/p50" 2)" \
        "$(median "ucx/tag_bw/$size/bw" 1 1.048576)" \
        "$(median "ucx/tag_bw/$size/rate" 0)" \
        "$(median "rdmx/send_bw/$size/bw" 1)" \
        "$(median "rdmx/send_bw/$size/rate" 0)" \
        "$(median "rdmx/write_bw/$size/bw" 1)"
done
echo
echo "Notes: UCX tag_lat is ucx_perftest's \"50.0%ile\" column (median of its recent-iterations"
echo "window), a one-way latency (ping-pong round trip / 2); its overall average is in the"
echo "details below. UCX bandwidth and message rate are the \"overall\" columns of tag_bw."
echo "MB/s are 10^6 bytes/s in this table (ucx_perftest prints 2^20 bytes/s; converted here,"
echo "not in the details). rdmx send_lat p50 is also one-way (RTT/2)."
echo
echo "## Commands"
echo
echo '```'
echo "# UCX, per size and test (server first, on a fresh port; killed after the client ends)"
spin=${UCX_SERVER_PIN[*]:+ ${UCX_SERVER_PIN[*]}}
cpin=${UCX_CLIENT_PIN[*]:+ ${UCX_CLIENT_PIN[*]}}
echo "UCX_TLS=tcp UCX_NET_DEVICES=$UCX_DEVICES timeout 60 ucx_perftest -p PORT$spin"
echo "UCX_TLS=tcp UCX_NET_DEVICES=$UCX_DEVICES timeout 60 ucx_perftest 127.0.0.1 -p PORT$cpin -t tag_lat -s SIZE -n LAT_ITERS -w WARMUP"
echo "UCX_TLS=tcp UCX_NET_DEVICES=$UCX_DEVICES timeout 60 ucx_perftest 127.0.0.1 -p PORT$cpin -t tag_bw -s SIZE -n BW_ITERS -w WARMUP"
echo "# rdmx"
echo "taskset -c 0 target/release/rdmx perf --server --once --port 0 --print-port --busy-poll   # per run; prints PORT"
echo "taskset -c 1 target/release/rdmx perf --connect 127.0.0.1:PORT --test send_lat --size SIZE --iters LAT_ITERS --busy-poll --json"
echo "taskset -c 1 target/release/rdmx perf --connect 127.0.0.1:PORT --test send_bw --size SIZE --iters BW_ITERS --busy-poll --json"
echo "taskset -c 1 target/release/rdmx perf --connect 127.0.0.1:PORT --test write_bw --size SIZE --iters BW_ITERS --busy-poll --json"
echo "# (with fewer than 2 CPUs or UCX_PIN=0: rdmx perf --local ... unpinned)"
echo '```'
echo
echo "| size | LAT_ITERS | BW_ITERS | WARMUP (UCX, lat / bw) |"
echo "| ---: | ---: | ---: | ---: |"
for size in "${SIZES[@]}"; do
    li=$(lat_iters "$size")
    bi=$(bw_iters "$size")
    echo "| $size | $li | $bi | $(warmup_of "$li") / $(warmup_of "$bi") |"
done
echo
echo "## Details (every run)"
echo
echo "UCX columns: latency 50%ile, latency overall average (tag_bw: send overhead), MB/s as"
echo "printed by ucx_perftest (2^20 bytes/s), msg/s. rdmx columns: latency p50, latency p99,"
echo "MB/s (10^6 bytes/s), msg/s."
echo
echo "| tool | test | size | rep | lat p50 (us) | lat avg / p99 (us) | MB/s | msg/s |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
if ((${#RAW[@]})); then
    printf '%s\n' "${RAW[@]}"
fi
