#!/usr/bin/env bash
# ud-vs-rc.sh: rdmx message-layer endpoints over UD against RC, alternated in one run:
# 8 B latency, 8 B message rate, 1 MiB bandwidth. Prints one line per run:
#   REP TRANSPORT TEST lat_p50_us msg_rate bw_MBps msg_protocol
# Usage: bench/ud-vs-rc.sh [REPS]   (builds target/release/rdmx unless SKIP_BUILD=1)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPS=${1:-3}
BIN="$ROOT/target/release/rdmx"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -q -p rdmx-tools)
one() { # TRANSPORT TEST SIZE ITERS
    local out port s
    out=$(mktemp)
    taskset -c 0 "$BIN" perf --layer msg --server --once --port 0 --print-port --busy-poll \
        --transport "$1" >"$out" 2>/dev/null &
    s=$!
    for _ in $(seq 50); do
        port=$(head -1 "$out" | grep -o '[0-9]*' | tail -1 || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    taskset -c 1 "$BIN" perf --layer msg --connect "127.0.0.1:$port" --test "$2" --size "$3" \
        --iters "$4" --busy-poll --transport "$1" --json 2>/dev/null | tail -1
    wait "$s" 2>/dev/null || true
    rm -f "$out"
}
uptime >&2
for rep in $(seq "$REPS"); do
    for t in rc ud; do
        for spec in "lat 8 20000" "rate 8 100000" "bw 1048576 1000"; do
            # shellcheck disable=SC2086
            set -- $spec
            one "$t" "$1" "$2" "$3" | python3 -c "import json,sys
d=json.loads(sys.stdin.read())
print($rep, '$t', '$1', d.get('lat_p50_us'), round(d['msg_rate']), round(d['bw_MBps'],1), d.get('msg_protocol'))"
        done
    done
done
uptime >&2
