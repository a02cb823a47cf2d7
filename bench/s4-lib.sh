# S4's server, load and switch, for bench/s4-adaptive (all its modes).
# Needs bench/lib.sh sourced and bench_setup run, and $port set.
#
# S4_SLEEP picks the sleep-bound handler: "cgi" (default) the CGI sleeping
# 200 ms, which still forks once a request, so that its throughput is
# bound by the forks' CPU from some concurrency on (about 30 on 2 cores); "proxy" a
# backend that waits 200 ms (bench/sleep-backend.c) behind mod_proxy_http,
# which costs no fork and stays sleep-bound up to max. The proxy's results
# go to files named with -proxy.

# s4_tag is what the result files' names carry.
case ${S4_SLEEP:=cgi} in
cgi) s4_sleep_path=/sleep/cpu.cgi s4_tag="" ;;
proxy) s4_sleep_path=/wait/ s4_tag=-proxy ;;
*) echo "S4_SLEEP must be cgi or proxy, not '$S4_SLEEP'" >&2; exit 2 ;;
esac
export S4_SLEEP
s4_backend_port=$((port + 1))

# With S4_SLEEP=proxy, the backend, built and started once for the script
# (bounded to an hour) and stopped by its pid when the script exits.
s4_backend_start() {
    [ "$S4_SLEEP" = proxy ] || return 0
    gcc -O2 -Wall -Wextra -pthread -o "$out/sleep-backend" bench/sleep-backend.c
    "$out/sleep-backend" -p "$s4_backend_port" -m 200 -d 3600 &
    s4_backend_pid=$!
    trap 'kill "$s4_backend_pid" 2>/dev/null || true' EXIT
    sleep 0.2
    kill -0 "$s4_backend_pid"
}

s4_proxy_conf() {
    [ "$S4_SLEEP" = proxy ] || return 0
    echo "ProxyPass /wait/ http://127.0.0.1:$s4_backend_port/
ThrottleHandler proxy-server heavy"
}

s4_start() { # zone-arguments
    local modules="cgid alias env adaptive_throttle"
    [ "$S4_SLEEP" = proxy ] && modules="$modules proxy proxy_http"
    bench_start s4 "$port" event "$modules" "$(bench_event_conf)
ScriptAlias /cpu/ \"$PWD/$out/cgi-bin/\"
ScriptAlias /sleep/ \"$PWD/$out/cgi-bin/\"
ScriptAlias /io/ \"$PWD/$out/cgi-bin/\"
<Directory \"$PWD/$out/cgi-bin\">
    Require all granted
</Directory>
<Location /sleep/>
    SetEnv BENCH_SLEEP_MS 200
</Location>
<Location /io/>
    SetEnv BENCH_SLEEP_MS 100
</Location>
ThrottleZone heavy $1 queue=100 timeout=30s
ThrottleHandler cgi-script heavy
$(s4_proxy_conf)
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

# One server with limit=auto (no min or max), 80 clients: CPU-bound for SWITCH s, then
# sleep-bound, then CPU-bound again; the limit and the held level sampled 4
# times a second into DIR/switch-limit, and when each phase really started
# into DIR/switch-t0 (a load run ends only when its last answers are in,
# which at a low limit is seconds after its time is up).
s4_switch() { # dir switch-seconds
    local dir=$1 switch=$2 sampler
    s4_start "limit=auto"
    s4_sample_limit "$dir/switch-limit" $((3 * switch + 15)) &
    sampler=$!
    : > "$dir/switch-t0"
    date +%s.%N >> "$dir/switch-t0"
    s4_load "$dir/switch-1" 80 /cpu/cpu.cgi "$switch"
    date +%s.%N >> "$dir/switch-t0"
    s4_load "$dir/switch-2" 80 "$s4_sleep_path" "$switch"
    date +%s.%N >> "$dir/switch-t0"
    s4_load "$dir/switch-3" 80 /cpu/cpu.cgi "$switch"
    date +%s.%N >> "$dir/switch-t0"
    wait "$sampler" || true
    bench_stop
    # With BENCH_LOGLEVEL="warn adaptive_throttle:trace1" the windows the
    # controller judged, for each run.
    cp "$bench_dir/error_log" "$dir/error_log" 2>/dev/null || true
}
