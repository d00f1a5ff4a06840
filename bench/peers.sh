#!/usr/bin/env bash
# peers.sh: what a peer costs, RC against UD, at 10, 1,000 and 10,000 peers: queue pairs per
# context and bytes per endpoint (examples/peer_memory.rs), one JSON line per run.
# Usage: bench/peers.sh [PEERS...]   (builds the example unless SKIP_BUILD=1)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/target/release/examples/peer_memory"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -q --example peer_memory)
[ $# -gt 0 ] || set -- 10 1000 10000
uptime >&2
for n in "$@"; do
    for t in rc ud; do
        timeout 600 "$BIN" "$t" "$n" 2>/dev/null || echo "{\"transport\":\"$t\",\"peers\":$n,\"error\":\"failed or over 600 s\"}"
    done
done
uptime >&2
