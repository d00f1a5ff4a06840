#!/usr/bin/env bash
# compare-msg.sh: measure the rdmx message layer (`rdmx perf --layer msg`) against the rdmx
# verbs layer and UCX's ucx_perftest over TCP (UCX_TLS=tcp), on this machine, in the same
# run, and print a markdown report with a verdict per target.
#
# Usage:  bench/compare-msg.sh > results.md        (progress goes to stderr)
#
# What is measured (REPS times each, interleaved; the tables show medians):
#   8 B latency    rdmx msg lat | rdmx verbs send_lat | UCX ucp_am_lat | UCX tag_lat
#   8 B rate       rdmx msg rate | UCX ucp_am_bw | UCX tag_bw            (message rate)
#   1 MiB bw       rdmx msg bw (rendezvous) | rdmx verbs write_bw | UCX ucp_am_bw | UCX tag_bw
#                  and rdmx msg bw_shared (one application buffer sent every time, zero copy
#                  through the registration cache, as write_bw sends one buffer)
# and, EXTRA_REPS times each: rdmx msg lat at 8 KiB and 64 KiB, msg bw at 64 KiB, with the
# verbs send_lat / write_bw at the same sizes for context.
#
# Environment knobs (all optional):
#   REPS=5 EXTRA_REPS=3            repetitions (the tables show the median)
#   UCX_PORT_BASE=14337            first TCP port tried for ucx_perftest's side channel
#   UCX_NET_DEVICES=lo             UCX network device(s); lo keeps UCX on loopback like rdmx
#   PIN=1                          server on CPU 0, client on CPU 1 (ucx_perftest -c, rdmx
#                                  taskset) when there are >= 2 CPUs; else rdmx runs --local
#   SKIP_UCX=1 / SKIP_EXTRA=1      leave UCX / the extra sizes out
#   SKIP_BUILD=1                   use an existing target/release/rdmx instead of building
#   KEEP_LOGS=1                    keep the per-run logs (their directory is printed)
#
# Besides the medians, the report gives paired ratios: for each repetition, msg against the
# other tool's run of the same repetition (seconds apart), then the median of those ratios;
# on a noisy machine they move less than the ratio of two medians.
#
# Everything busy-polls (rdmx --busy-poll; ucx_perftest always polls). All latencies are
# one-way (ping-pong round trip / 2). UCX prints MB/s as 2^20 bytes/s; the tables convert it
# to 10^6 bytes/s like rdmx.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPS=${REPS:-5}
EXTRA_REPS=${EXTRA_REPS:-3}
NEXT_PORT=${UCX_PORT_BASE:-14337}
UCX_DEVICES=${UCX_NET_DEVICES:-lo}
PINNED=0
if [[ "${PIN:-1}" == 1 ]] && (($(nproc) >= 2)) && command -v taskset >/dev/null; then
    PINNED=1
fi
RDMX="$ROOT/target/release/rdmx"
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/compare-msg.XXXXXX")

# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
cleanup() {
    if [[ "${KEEP_LOGS:-0}" == 1 ]]; then
        log "logs kept in $LOGDIR"
    else
        rm -rf "$LOGDIR"
    fi
}
trap cleanup EXIT


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

build_rdmx

# ------------------------------------------------------------------------------- runners --
# Each runner sets RESULT to "lat_p50 lat2 bw msg_rate extra" (n/a for missing fields) and
# leaves the raw output in a log. They run in the main shell so that NEXT_PORT advances.

# ucx_perftest's final line:
#   Final: <iters> <lat 50%ile> <lat avg> <lat overall> <MB/s avg> <MB/s overall> <msg/s avg> <msg/s overall>
# run_ucx TEST SIZE ITERS LOG -> RESULT="p50 lat_overall MB/s(2^20) msg/s -"
run_ucx() {
    local test=$1 size=$2 iters=$3 out=$4 spid waited=0
    local -a spin=() cpin=()
    ((PINNED)) && spin=(-c 0) && cpin=(-c 1)
    RESULT=
    next_free_port
    env UCX_TLS=tcp UCX_NET_DEVICES="$UCX_DEVICES" timeout 60 ucx_perftest -p "$PORT" \
        "${spin[@]}" >"$out.server" 2>&1 &
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
        -p "$PORT" "${cpin[@]}" -t "$test" -s "$size" -n "$iters" \
        -w "$(warmup_of "$iters")" >"$out" 2>&1 || log "ucx_perftest $test -s $size failed (exit $?)"
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    RESULT=$(awk '$1 == "Final:" && NF == 9 { line = $3 " " $5 " " $7 " " $9 " -" }
        END { if (line != "") print line }' "$out")
}

# `rdmx perf --json` prints one JSON object per result line (test, size, lat_p50_us,
# lat_p99_us, bw_MBps, msg_rate; --layer msg adds msg_protocol and credit_waits).
# run_rdmx LAYER TEST SIZE ITERS LOG -> RESULT="p50 p99 MB/s msg/s protocol/credit_waits"
run_rdmx() {
    local layer=$1 test=$2 size=$3 iters=$4 out=$5
    RESULT=
    if ((PINNED)); then
        local srv port="" waited=0
        taskset -c 0 timeout 150 "$RDMX" perf --layer "$layer" --server --once --port 0 \
            --print-port --busy-poll >"$out.server" 2>&1 &
        srv=$!
        while [[ -z "$port" ]] && ((waited < 100)); do
            port=$({ head -n 1 "$out.server" 2>/dev/null || true; } | tr -dc '0-9')
            [[ -n "$port" ]] || { sleep 0.05; waited=$((waited + 1)); }
        done
        taskset -c 1 timeout 120 "$RDMX" perf --layer "$layer" --connect "127.0.0.1:$port" \
            --test "$test" --size "$size" --iters "$iters" --busy-poll --json >"$out" 2>&1 ||
            log "rdmx perf --layer $layer --test $test --size $size failed (exit $?)"
        kill "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
    else
        timeout 120 "$RDMX" perf --layer "$layer" --local --test "$test" --size "$size" \
            --iters "$iters" --busy-poll --json >"$out" 2>&1 ||
            log "rdmx perf --layer $layer --test $test --size $size failed (exit $?)"
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
        if isinstance(obj, dict) and str(obj.get("size")) == sys.argv[2]:
            row = obj
if row is not None:
    def num(key, digits):
        v = row.get(key)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
        return "%.*f" % (digits, v) if ok else "n/a"
    extra = "-"
    if row.get("layer") == "msg":
        extra = "%s/%s" % (row.get("msg_protocol"), row.get("credit_waits"))
    print(num("lat_p50_us", 3), num("lat_p99_us", 3), num("bw_MBps", 2), num("msg_rate", 0), extra)
PY
)
}

# ------------------------------------------------------------------------------ measure --
declare -A VALS # "tool/test/size/field" -> values of all reps, space separated
RAW=()

# measure TOOL LAYER TEST SIZE ITERS REP  (TOOL is ucx, verbs or msg)
measure() {
    local tool=$1 layer=$2 test=$3 size=$4 iters=$5 rep=$6 f
    log "rep $rep: $tool $test $size ($iters iterations)"
    if [[ $tool == ucx ]]; then
        ((HAVE_UCX)) || return 0
        run_ucx "$test" "$size" "$iters" "$LOGDIR/ucx-$test-$size-$rep"
    else
        run_rdmx "$layer" "$test" "$size" "$iters" "$LOGDIR/$tool-$test-$size-$rep"
    fi
    local -a v
    read -r -a v <<<"${RESULT:-}"
    local row="| $tool | $test | $size | $rep |"
    local i=0
    for f in p50 lat2 bw rate extra; do
        local x=${v[$i]:-n/a}
        VALS["$tool/$test/$size/$f"]+="$x "
        row+=" $x |"
        i=$((i + 1))
    done
    RAW+=("$row")
}

M=1048576
START=$(date +%s)
for ((rep = 1; rep <= REPS; rep++)); do
    # 8 B latency
    measure ucx - ucp_am_lat 8 20000 "$rep"
    measure ucx - tag_lat 8 20000 "$rep"
    measure verbs verbs send_lat 8 20000 "$rep"
    measure msg msg lat 8 20000 "$rep"
    # 8 B message rate
    measure ucx - ucp_am_bw 8 100000 "$rep"
    measure ucx - tag_bw 8 100000 "$rep"
    measure msg msg rate 8 100000 "$rep"
    # 1 MiB bandwidth
    measure ucx - ucp_am_bw $M 1000 "$rep"
    measure ucx - tag_bw $M 1000 "$rep"
    measure verbs verbs write_bw $M 1000 "$rep"
    measure msg msg bw $M 1000 "$rep"
    measure msg msg bw_shared $M 1000 "$rep"
done
if [[ "${SKIP_EXTRA:-0}" != 1 ]]; then
    for ((rep = 1; rep <= EXTRA_REPS; rep++)); do
        measure verbs verbs send_lat 8192 20000 "$rep"
        measure msg msg lat 8192 20000 "$rep"
        measure verbs verbs send_lat 65536 5000 "$rep"
        measure msg msg lat 65536 5000 "$rep"
        measure verbs verbs write_bw 65536 10000 "$rep"
        measure msg msg bw 65536 10000 "$rep"
    done
fi
ELAPSED=$(($(date +%s) - START))


# verdict EXPR -> "met" / "not met" / "n/a" (EXPR is an awk condition on numbers; any n/a
# operand gives n/a)
verdict() {
    case "$1" in *n/a*) echo "n/a"; return ;; esac
    awk "BEGIN { print (($1) ? \"met\" : \"**not met**\") }"
}
ratio() { # ratio A B -> A/B with 2 decimals
    case "$1 $2" in *n/a*) echo "n/a"; return ;; esac
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
}

# ------------------------------------------------------------------------------- report --
cpu_model=$(awk -F: '/^model name/ { sub(/^[ \t]+/, "", $2); print $2; exit }' /proc/cpuinfo 2>/dev/null)
ucx_version=n/a
if ((HAVE_UCX)); then
    ucx_version=$(ucx_info -v 2>/dev/null | awk '/Version/ { print $NF; exit }')
    pkg=$(dpkg-query -W -f='${Version}' ucx-utils 2>/dev/null || true)
    [[ -n "$pkg" ]] && ucx_version="$ucx_version (Debian ucx-utils $pkg)"
fi
rdmx_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
# The binary is built from the working tree: say so when it differs from HEAD outside docs/
# and bench/.
if ! git -C "$ROOT" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude)bench' 2>/dev/null; then
    rdmx_rev="$rdmx_rev + uncommitted changes"
fi

lat_msg=$(median msg/lat/8/p50 2)
lat_verbs=$(median verbs/send_lat/8/p50 2)
lat_am=$(median ucx/ucp_am_lat/8/p50 2)
lat_tag=$(median ucx/tag_lat/8/p50 2)
rate_msg=$(median msg/rate/8/rate 0)
rate_am=$(median ucx/ucp_am_bw/8/rate 0)
rate_tag=$(median ucx/tag_bw/8/rate 0)
bw_msg=$(median msg/bw/$M/bw 1)
bw_verbs=$(median verbs/write_bw/$M/bw 1)
bw_am=$(median ucx/ucp_am_bw/$M/bw 1 1.048576)
bw_tag=$(median ucx/tag_bw/$M/bw 1 1.048576)

echo "# rdmx message layer vs rdmx verbs vs UCX ucx_perftest (TCP), same machine, same run"
echo
echo "* date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "* kernel: $(uname -r); CPUs: $(nproc); CPU model: ${cpu_model:-unknown}"
echo "* load average at the end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
if ((PINNED)); then
    echo "* pinning: servers on CPU 0, clients on CPU 1 (ucx_perftest -c, rdmx taskset)"
else
    echo "* pinning: none (rdmx perf --local)"
fi
echo "* ucx_perftest: UCX ${ucx_version:-unknown}, UCX_TLS=tcp, UCX_NET_DEVICES=$UCX_DEVICES"
echo "* rdmx: $RDMX (git $rdmx_rev), --busy-poll"
echo "* repetitions: $REPS (extra sizes: $EXTRA_REPS), medians shown; measuring took ${ELAPSED}s"
echo
echo "| measurement | UCX ucp_am | UCX tag | rdmx verbs | rdmx msg | target | verdict |"
echo "| --- | ---: | ---: | ---: | ---: | --- | --- |"
echo "| latency 8 B, p50 (us) | $lat_am | $lat_tag | $lat_verbs (send_lat) | $lat_msg | msg <= UCX tcp (both) | $(verdict "$lat_msg <= $lat_am && $lat_msg <= $lat_tag") |"
echo "| | | | | | msg <= 1.10 x verbs send_lat (msg/verbs = $(ratio "$lat_msg" "$lat_verbs")) | $(verdict "$lat_msg <= 1.10 * $lat_verbs") |"
echo "| message rate 8 B (msg/s) | $rate_am | $rate_tag | | $rate_msg | msg >= UCX tcp (both) | $(verdict "$rate_msg >= $rate_am && $rate_msg >= $rate_tag") |"
echo "| bandwidth 1 MiB (MB/s) | $bw_am | $bw_tag | $bw_verbs (write_bw) | $bw_msg | msg >= 0.95 x verbs write_bw (msg/verbs = $(ratio "$bw_msg" "$bw_verbs")) | $(verdict "$bw_msg >= 0.95 * $bw_verbs") |"
echo "| bandwidth 1 MiB, one buffer (MB/s) | | | | $(median msg/bw_shared/$M/bw 1) (bw_shared) | (informative) | |"
echo
echo "Paired (the median over repetitions of each repetition's own ratio; runs of one"
echo "repetition ran seconds apart, so this cancels part of the drift between repetitions):"
echo
echo "| ratio | paired median | target | verdict |"
echo "| --- | ---: | --- | --- |"
p_lat_ucx=$(paired msg/lat/8/p50 ucx/ucp_am_lat/8/p50 ucx/tag_lat/8/p50)
p_lat_verbs=$(paired msg/lat/8/p50 verbs/send_lat/8/p50)
p_bw=$(paired msg/bw/$M/bw verbs/write_bw/$M/bw)
p_bw_shared=$(paired msg/bw_shared/$M/bw verbs/write_bw/$M/bw)
echo "| msg lat 8 B / better UCX lat | $p_lat_ucx | <= 1.00 | $(verdict "$p_lat_ucx <= 1.00") |"
echo "| msg lat 8 B / verbs send_lat | $p_lat_verbs | <= 1.10 | $(verdict "$p_lat_verbs <= 1.10") |"
p_rate_am=$(paired msg/rate/8/rate ucx/ucp_am_bw/8/rate)
p_rate_tag=$(paired msg/rate/8/rate ucx/tag_bw/8/rate)
echo "| msg rate 8 B / UCX ucp_am_bw | $p_rate_am | >= 1.00 | $(verdict "$p_rate_am >= 1.00") |"
echo "| msg rate 8 B / UCX tag_bw | $p_rate_tag | >= 1.00 | $(verdict "$p_rate_tag >= 1.00") |"
echo "| msg bw 1 MiB / verbs write_bw | $p_bw | >= 0.95 | $(verdict "$p_bw >= 0.95") |"
echo "| msg bw_shared 1 MiB (one buffer, like write_bw) / verbs write_bw | $p_bw_shared | >= 0.95 | $(verdict "$p_bw_shared >= 0.95") |"
if [[ "${SKIP_EXTRA:-0}" != 1 ]]; then
    echo
    echo "| extra (medians of $EXTRA_REPS) | rdmx verbs | rdmx msg | msg protocol |"
    echo "| --- | ---: | ---: | --- |"
    for s in 8192 65536; do
        echo "| latency $s B, p50 (us) | $(median verbs/send_lat/$s/p50 2) (send_lat) | $(median msg/lat/$s/p50 2) | ${VALS[msg/lat/$s/extra]%%/*} |"
    done
    echo "| bandwidth 65536 B (MB/s) | $(median verbs/write_bw/65536/bw 1) (write_bw) | $(median msg/bw/65536/bw 1) | ${VALS[msg/bw/65536/extra]%%/*} |"
fi
echo
echo "UCX latencies are ucx_perftest's \"50.0%ile\" column (one-way); UCX MB/s and msg/s are"
echo "its \"overall\" columns, MB/s converted to 10^6 bytes/s. rdmx latencies are p50, one-way."
echo
echo "## Commands"
echo
echo '```'
echo "# UCX, per test (server first, on a fresh port; killed after the client ends)"
echo "UCX_TLS=tcp UCX_NET_DEVICES=$UCX_DEVICES timeout 60 ucx_perftest -p PORT -c 0"
echo "UCX_TLS=tcp UCX_NET_DEVICES=$UCX_DEVICES timeout 60 ucx_perftest 127.0.0.1 -p PORT -c 1 -t {ucp_am_lat,tag_lat} -s 8 -n 20000 -w 1000"
echo "UCX_TLS=tcp UCX_NET_DEVICES=$UCX_DEVICES timeout 60 ucx_perftest 127.0.0.1 -p PORT -c 1 -t {ucp_am_bw,tag_bw} -s 8 -n 100000 -w 1000"
echo "UCX_TLS=tcp UCX_NET_DEVICES=$UCX_DEVICES timeout 60 ucx_perftest 127.0.0.1 -p PORT -c 1 -t {ucp_am_bw,tag_bw} -s 1048576 -n 1000 -w 100"
echo "# rdmx, per run (LAYER is verbs or msg; the server prints PORT)"
echo "taskset -c 0 target/release/rdmx perf --layer LAYER --server --once --port 0 --print-port --busy-poll"
echo "taskset -c 1 target/release/rdmx perf --layer verbs --connect 127.0.0.1:PORT --test send_lat --size 8 --iters 20000 --busy-poll --json"
echo "taskset -c 1 target/release/rdmx perf --layer msg   --connect 127.0.0.1:PORT --test lat      --size 8 --iters 20000 --busy-poll --json"
echo "taskset -c 1 target/release/rdmx perf --layer msg   --connect 127.0.0.1:PORT --test rate     --size 8 --iters 100000 --busy-poll --json"
echo "taskset -c 1 target/release/rdmx perf --layer verbs --connect 127.0.0.1:PORT --test write_bw --size 1048576 --iters 1000 --busy-poll --json"
echo "taskset -c 1 target/release/rdmx perf --layer msg   --connect 127.0.0.1:PORT --test bw       --size 1048576 --iters 1000 --busy-poll --json"
echo "# extra: msg lat / verbs send_lat at 8192 (20000 iters) and 65536 (5000 iters);"
echo "#        msg bw / verbs write_bw at 65536 (10000 iters)"
echo '```'
echo
echo "## Details (every run)"
echo
echo "UCX: latency 50%ile, latency overall average (bw tests: per-message send overhead), MB/s"
echo "as printed (2^20 bytes/s), msg/s. rdmx: latency p50, p99, MB/s (10^6 bytes/s), msg/s,"
echo "and for the message layer the protocol used / credit waits."
echo
echo "| tool | test | size | rep | lat p50 (us) | lat avg / p99 (us) | MB/s | msg/s | protocol / credit waits |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
if ((${#RAW[@]})); then
    printf '%s\n' "${RAW[@]}"
fi
