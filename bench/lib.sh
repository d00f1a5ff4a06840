#!/usr/bin/env bash
# Helpers shared by the bench/compare-*.sh scripts (sourced, not run). Callers set
# NEXT_PORT and an associative array VALS before using them.

log() { printf '%s\n' "$*" >&2; }

# Builds target/release/rdmx in $ROOT unless SKIP_BUILD=1 (the log in $LOGDIR/build.log,
# its tail on stderr when it fails), then checks that $RDMX is there; exits on failure.
build_rdmx() {
    if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
        log "building rdmx (cargo build --release -p rdmx-tools)"
        if ! (cd "$ROOT" && cargo build --release -p rdmx-tools) >"$LOGDIR/build.log" 2>&1; then
            tail -n 20 "$LOGDIR/build.log" >&2 || true
            log "cargo build failed"
            exit 1
        fi
    fi
    [[ -x "$RDMX" ]] || { log "$RDMX missing"; exit 1; }
}

warmup_of() { # ucx_perftest defaults to 10000 warm-up iterations; scale them with the run
    local w=$(($1 / 10))
    ((w > 1000)) && w=1000
    echo "$w"
}

# True when some local TCP socket (any state) uses port $1.
port_in_use() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" 'FNR > 1 && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
# True when a local TCP socket listens on port $1.
port_listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" 'FNR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
        END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
# Sets PORT to a fresh free port (never reuses one, so no TIME_WAIT clashes between runs).
next_free_port() {
    while port_in_use "$NEXT_PORT"; do NEXT_PORT=$((NEXT_PORT + 1)); done
    PORT=$NEXT_PORT
    NEXT_PORT=$((NEXT_PORT + 1))
}

# median KEY DECIMALS [SCALE] -> median of the numeric values recorded under KEY, times
# SCALE, or n/a
median() {
    local -a vals
    read -r -a vals <<<"${VALS[$1]:-}"
    ((${#vals[@]})) || vals=(n/a)
    printf '%s\n' "${vals[@]}" | awk -v d="$2" -v k="${3:-1}" '
        $1 ~ /^[-+0-9.eE]+$/ { v[n++] = $1 + 0 }
        END {
            if (n == 0) { print "n/a"; exit }
            for (i = 1; i < n; i++) { x = v[i]; j = i - 1; while (j >= 0 && v[j] > x) { v[j + 1] = v[j]; j-- } v[j + 1] = x }
            m = (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
            printf "%.*f\n", d, m * k
        }'
}

# paired KEY_A KEY_B [MIN_OF_KEY_C] -> median over repetitions r of A[r] / B[r] (with a third
# key, of A[r] / min(B[r], C[r])), 2 decimals, or n/a. Runs of one repetition ran seconds
# apart, so each ratio cancels part of this machine's drift between repetitions.
paired() {
    local -a a b c
    read -r -a a <<<"${VALS[$1]:-}"
    read -r -a b <<<"${VALS[$2]:-}"
    read -r -a c <<<"${VALS[${3:-__none__}]:-}"
    local n=${#a[@]} i out=""
    for ((i = 0; i < n; i++)); do
        out+="${a[$i]} ${b[$i]:-n/a} ${c[$i]:-}"$'\n'
    done
    printf '%s' "$out" | awk '
        $1 ~ /^[-+0-9.eE]+$/ && $2 ~ /^[-+0-9.eE]+$/ {
            d = $2 + 0
            if (NF >= 3 && $3 ~ /^[-+0-9.eE]+$/ && $3 + 0 < d) d = $3 + 0
            if (d > 0) r[n++] = ($1 + 0) / d
        }
        END {
            if (n == 0) { print "n/a"; exit }
            for (i = 1; i < n; i++) { x = r[i]; j = i - 1; while (j >= 0 && r[j] > x) { r[j + 1] = r[j]; j-- } r[j + 1] = x }
            m = (n % 2) ? r[(n - 1) / 2] : (r[n / 2 - 1] + r[n / 2]) / 2
            printf "%.2f\n", m
        }'
}
