# S4's server, load and switch, shared by bench/s4-adaptive and
# bench/s4-switch. Needs bench/lib.sh sourced and bench_setup run, and
# $port set.

s4_start() { # zone-arguments
    bench_start s4 "$port" event "cgid alias env adaptive_throttle" "$(bench_event_conf)
ScriptAlias /cpu/ \"$PWD/$out/cgi-bin/\"
ScriptAlias /sleep/ \"$PWD/$out/cgi-bin/\"
<Directory \"$PWD/$out/cgi-bin\">
    Require all granted
</Directory>
<Location /sleep/>
    SetEnv BENCH_SLEEP_MS 200
</Location>
ThrottleZone heavy $1 queue=100 timeout=30s
ThrottleHandler cgi-script heavy
<Location /ts>
    SetHandler throttle-status
</Location>"
}

s4_load() { # output clients path seconds
    "$out/loadgen" -p "$port" -c "$2" -d "$4" -r -u "$3" -o "$1"
}

s4_sample_limit() { # output seconds
    local end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do
        printf '%s %s\n' "$(date +%s.%N)" \
            "$(curl -s "http://127.0.0.1:$port/ts?auto" \
               | awk -F': ' '$1 == "Throttle.heavy.Limit" {l = $2}
                            $1 == "Throttle.heavy.LimitHeld" {h = $2}
                            END {print l, h}')"
        sleep 0.25
    done > "$1"
}

# One server with limit=auto, 80 clients: CPU-bound for SWITCH s, then
# sleep-bound, then CPU-bound again; the limit and the held level sampled 4
# times a second into DIR/switch-limit, and when each phase really started
# into DIR/switch-t0 (a load run ends only when its last answers are in,
# which at a low limit is seconds after its time is up).
s4_switch() { # dir switch-seconds
    local dir=$1 switch=$2 sampler
    s4_start "limit=auto min=1 max=64"
    s4_sample_limit "$dir/switch-limit" $((3 * switch + 15)) &
    sampler=$!
    : > "$dir/switch-t0"
    date +%s.%N >> "$dir/switch-t0"
    s4_load "$dir/switch-1" 80 /cpu/cpu.cgi "$switch"
    date +%s.%N >> "$dir/switch-t0"
    s4_load "$dir/switch-2" 80 /sleep/cpu.cgi "$switch"
    date +%s.%N >> "$dir/switch-t0"
    s4_load "$dir/switch-3" 80 /cpu/cpu.cgi "$switch"
    date +%s.%N >> "$dir/switch-t0"
    wait "$sampler" || true
    bench_stop
    # With BENCH_LOGLEVEL="warn adaptive_throttle:trace1" the windows the
    # controller judged, for each run.
    cp "$bench_dir/error_log" "$dir/error_log" 2>/dev/null || true
}
