# Shared by the benchmark scripts: setup, and a private httpd on 127.0.0.1.
# Source it from the top of the tree.

bench_setup() {
    scripts/setup >/dev/null
    local need=""
    command -v gnuplot >/dev/null || need="$need gnuplot-nox"
    command -v wrk >/dev/null || need="$need wrk"
    # loadgen's -s (TLS) links OpenSSL
    pkg-config --exists openssl 2>/dev/null || need="$need libssl-dev"
    if [ -n "$need" ]; then
        local sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo apt-get install -y -qq $need >/dev/null
    fi
    out=bench/out
    mkdir -p "$out" docs/benchmarks
    # shellcheck disable=SC2046  # the libraries' flags, one word each
    gcc -O2 -Wall -Wextra -pthread -o "$out/loadgen" bench/loadgen.c $(pkg-config --libs openssl)
    moddir=$(apxs -q LIBEXECDIR)
}

# The cores this run may use (its CPU affinity, as a taskset list: 0-1), and
# how many: a server that is not pinned gets these, its clients beside it.
bench_cpus() { awk '$1 == "Cpus_allowed_list:" {print $2}' /proc/self/status; }
bench_ncpus() { nproc; }

# bench_split_cpus: sets client_cpus and server_cpus (taskset lists) for a
# scenario that keeps its clients off the server's cores: the clients on the
# first core this run may use, the server on the others (both on the one
# core when there is one).
bench_split_cpus() {
    local ids
    ids=$(bench_cpus | tr ',' '\n' | awk -F- '{ for (i = $1; i <= ($2 == "" ? $1 : $2); i++) print i }')
    client_cpus=$(head -n 1 <<< "$ids")
    # the rest as a list again, runs of cores as ranges: 1-3,5
    server_cpus=$(tail -n +2 <<< "$ids" | awk '
        function run() { return first (last > first ? "-" last : "") }
        NR > 1 && $1 == last + 1 { last = $1; next }
        NR > 1 { out = out (out == "" ? "" : ",") run() }
        { first = last = $1 }
        END { if (NR) print out (out == "" ? "" : ",") run() }')
    [ -n "$server_cpus" ] || server_cpus=$client_cpus
}

# bench_version NAME: the version of httpd, php, haproxy, nginx, wrk or
# redis-server installed here, or "absent".
bench_version() {
    local PATH=$PATH:/usr/sbin:/sbin v=""
    case $1 in
    httpd) command -v apache2 >/dev/null &&
        v=$(apache2 -v 2>/dev/null | sed -n 's|^Server version: Apache/\([^ ]*\).*|\1|p') ;;
    php) command -v php >/dev/null && v=$(php -r 'echo PHP_VERSION;' 2>/dev/null) ;;
    haproxy) command -v haproxy >/dev/null &&
        v=$(haproxy -v 2>/dev/null | sed -n 's/^HA-*Proxy version \([^ ]*\).*/\1/p') ;;
    # scripts/setup unpacks Debian's nginx rather than installing it
    nginx) for n in nginx /var/cache/mod_adaptive_throttle/nginx; do
               command -v "$n" >/dev/null && v=$("$n" -v 2>&1 | sed -n 's|^nginx version: nginx/||p') && break
           done ;;
    # wrk -v exits 1 after printing "wrk 4.1.0 [epoll] ..." (Debian's: "wrk debian/4.1.0-3+b2")
    wrk) command -v wrk >/dev/null && v=$(wrk -v 2>&1 | awk 'NR == 1 {sub(/^debian\//, "", $2); print $2}') ;;
    redis-server) command -v redis-server >/dev/null &&
        v=$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([^ ]*\).*/\1/p') ;;
    esac
    echo "${v:-absent}"
}

# "core 1", "cores 0-1": a taskset list in words.
bench_cores_named() { case $1 in *[,-]*) echo "cores $1" ;; *) echo "core $1" ;; esac; }

# The commit of the tree the run measures, "+dirty" when files differ from
# it outside docs/benchmarks (which the runs write themselves), "unknown"
# out of git.
bench_commit() {
    local c
    c=$(git rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
    [ -z "$(git status --porcelain --untracked-files=no -- . ':!docs/benchmarks' 2>/dev/null)" ] ||
        c="$c+dirty"
    echo "$c"
}

# bench_env_record DIR [SERVER_CPUS CLIENT_CPUS]: what a run runs on, noted
# in DIR/env (KEY=VALUE lines) as it starts. Its report reads it back
# (bench_env DIR), never the tree or the machine at report time: a report
# made again from a run's files names what that run measured. SERVER_CPUS
# and CLIENT_CPUS are the taskset lists the scenario pins its server and
# clients to; without them both share the cores the run may use.
bench_env_record() {
    local dir=$1 t
    mkdir -p "$dir"
    {
        echo "commit=$(bench_commit)"
        echo "version=$(sed -n 's/^AC_INIT(\[[^]]*\], *\[\([^]]*\)\].*/\1/p' configure.ac 2>/dev/null)"
        echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "kernel=$(uname -r)"
        echo "cpu_model=$(awk -F': *' '$1 ~ /^model name/ {print $2; exit}' /proc/cpuinfo)"
        echo "machine=$(uname -m)"
        echo "cores_online=$(getconf _NPROCESSORS_ONLN)"
        echo "cpus=$(bench_cpus)"
        echo "ncpus=$(bench_ncpus)"
        echo "server_cpus=${2:-}"
        echo "client_cpus=${3:-}"
        echo "module=${BENCH_MODULE:-}"
        for t in httpd php haproxy nginx wrk redis-server; do
            echo "$t=$(bench_version "$t")"
        done
    } > "$dir/env.tmp"
    mv "$dir/env.tmp" "$dir/env"
}

# bench_env_get DIR KEY: one value of a run's recorded environment.
bench_env_get() {
    [ -r "$1/env" ] || {
        echo "bench: $1/env is missing: that run did not record its environment; run it again" >&2
        return 1
    }
    sed -n "s/^$2=//p" "$1/env" | head -n 1
}

# bench_env DIR: the paragraph every report starts with, under its title:
# the environment the run in DIR recorded when it started (bench_env_record).
# bench/BenchEnv.pm gives the Perl reports this same paragraph.
bench_env() {
    local dir=${1:?bench_env: the run directory whose env to read} commit pins t tools="" built
    # the version, not the commit: reports are docs, the commit stays in the
    # run's env and in the git log of the report
    commit=$(bench_env_get "$dir" commit) || return 1
    built="mod_adaptive_throttle $(bench_env_get "$dir" version)"
    [ "$built" != "mod_adaptive_throttle " ] || built="mod_adaptive_throttle (a run that noted no version)"
    case $commit in
    *+dirty) built="$built with local changes" ;;
    esac
    if [ -n "$(bench_env_get "$dir" server_cpus)" ]; then
        pins="server on $(bench_cores_named "$(bench_env_get "$dir" server_cpus)"),"
        pins="$pins clients on $(bench_cores_named "$(bench_env_get "$dir" client_cpus)")"
    else
        pins="server and clients sharing $(bench_cores_named "$(bench_env_get "$dir" cpus)")"
    fi
    t=$(bench_env_get "$dir" module)
    [ -z "$t" ] || pins="$pins; the module from $t"
    for t in httpd:httpd php:PHP haproxy:HAProxy nginx:nginx wrk:wrk redis-server:redis-server; do
        tools="$tools, ${t#*:} $(bench_env_get "$dir" "${t%%:*}")"
    done
    t=$(bench_env_get "$dir" cpu_model)
    printf 'Ran on %s, %s; Linux %s; %s, %s cores online; %s; %s.\n\n' \
        "$built" "$(bench_env_get "$dir" date)" "$(bench_env_get "$dir" kernel)" \
        "${t:-$(bench_env_get "$dir" machine)}" "$(bench_env_get "$dir" cores_online)" \
        "$pins" "${tools#, }"
}

# bench_envs LABEL=DIR...: the paragraph of a report made from several runs
# (one per MPM, one per application): one paragraph when they ran on the
# same commit, machine and tools (the first run's date), else one for each,
# headed by its label.
bench_envs() {
    local a first="" same=1 dir
    for a in "$@"; do
        dir=${a#*=}
        [ -r "$dir/env" ] || { bench_env_get "$dir" commit; return 1; }
        if [ -z "$first" ]; then
            first=$dir
        elif ! cmp -s <(grep -Ev '^(date|commit)=' "$first/env") <(grep -Ev '^(date|commit)=' "$dir/env"); then
            same=0
        fi
    done
    if [ "$same" = 1 ]; then
        bench_env "$first"
        return
    fi
    for a in "$@"; do
        printf '%s: ' "${a%%=*}"
        bench_env "${a#*=}" || return 1
    done
}

# bench_start NAME PORT MPM "MODULES" "CONFIGURATION"
# MODULES: extra module names to load (mod_NAME.so from apxs's LIBEXECDIR);
# "adaptive_throttle" loads the module from this build tree, or the one
# BENCH_MODULE names (a saved build, to compare two in one session).
bench_start() {
    local name=$1 port=$2 mpm=$3 modules=$4 conf=$5 m
    bench_dir=$PWD/$out/server-$name
    rm -rf "$bench_dir"; mkdir -p "$bench_dir/htdocs"
    chmod 755 "$bench_dir" "$bench_dir/htdocs"
    head -c 1024 /dev/zero | tr '\0' x > "$bench_dir/htdocs/1k.txt"
    chmod 644 "$bench_dir/htdocs/1k.txt"
    {
        echo "ServerRoot \"$bench_dir\""
        echo "ServerName 127.0.0.1"
        echo "Listen 127.0.0.1:$port"
        echo "PidFile httpd.pid"
        echo "ErrorLog error_log"
        echo "DefaultRuntimeDir \"$bench_dir\""
        echo "LogLevel ${BENCH_LOGLEVEL:-warn}"
        echo "User nobody"
        echo "Group nogroup"
        echo "LoadModule mpm_${mpm}_module $moddir/mod_mpm_${mpm}.so"
        for m in authz_core mime $modules; do
            if [ "$m" = adaptive_throttle ]; then
                echo "LoadModule adaptive_throttle_module ${BENCH_MODULE:-$PWD/.libs/mod_adaptive_throttle.so}"
            else
                echo "LoadModule ${m}_module $moddir/mod_${m}.so"
            fi
        done
        echo "TypesConfig /dev/null"
        echo "DocumentRoot \"$bench_dir/htdocs\""
        echo "<Directory \"$bench_dir/htdocs\">"
        echo "    Require all granted"
        echo "</Directory>"
        echo "$conf"
    } > "$bench_dir/httpd.conf"
    # BENCH_SERVER_CPUS (a taskset list): the server and every child it
    # forks run there only, away from the clients
    ${BENCH_SERVER_CPUS:+taskset -c "$BENCH_SERVER_CPUS"} \
        apache2 -d "$bench_dir" -f "$bench_dir/httpd.conf" -k start
    for _ in $(seq 100); do [ -s "$bench_dir/httpd.pid" ] && break; sleep 0.05; done
    sleep 1
}

bench_stop() {
    local pid
    pid=$(cat "$bench_dir/httpd.pid")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

# The CPU-burning CGI (bench/cpu-cgi.c), built and put in $out/cgi-bin.
bench_cpu_cgi() {
    gcc -O2 -Wall -Wextra -o "$out/cpu.cgi" bench/cpu-cgi.c
    mkdir -p "$out/cgi-bin"; chmod 755 "$out" "$out/cgi-bin"
    cp "$out/cpu.cgi" "$out/cgi-bin/cpu.cgi"; chmod 755 "$out/cgi-bin/cpu.cgi"
}

# The event MPM as S2, S3 and S4 run it: room for every client, no
# keep-alive (each request a new connection), mod_cgid's socket in the
# server's own directory.
bench_event_conf() {
    echo "StartServers 2
ServerLimit 8
ThreadsPerChild 32
MinSpareThreads 32
MaxSpareThreads 256
MaxRequestWorkers 256
KeepAlive Off
ScriptSock cgisock"
}

# /cgi-bin/ mapped to $out/cgi-bin (see bench_cpu_cgi).
bench_cgi_dir() {
    echo "ScriptAlias /cgi-bin/ \"$PWD/$out/cgi-bin/\"
<Directory \"$PWD/$out/cgi-bin\">
    Require all granted
</Directory>"
}

# bench_apt_install PACKAGE...: installs Debian's packages that are not
# installed yet, starting no service (a policy-rc.d that says no while it
# runs), once more after apt-get update if the package lists are stale; a
# package it cannot get stops the run, named. As root.
bench_apt_install() {
    local p missing="" own_policy=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
    done
    [ -n "$missing" ] || return 0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    # shellcheck disable=SC2086  # the packages' names
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
        { apt-get update -qq >/dev/null 2>&1 || true
          DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null; } ||
        { [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
          echo "bench: could not install Debian's$missing (apt-get install$missing)" >&2
          exit 1; }
    [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
}

# DokuWiki from Debian's archive, and a page of it rendered on every request
# (the ~~NOCACHE~~ macro, as dynamic pages use it): the syntax manual eight
# times over, with its RSS and external-image examples taken out so that
# nothing is fetched from outside this machine. Sets dokuwiki_page (the
# path to ask for, under Alias /dokuwiki /usr/share/dokuwiki). As root.
bench_dokuwiki() {
    local conf_was pages
    # Its "php" dependency is already met by php8.2-fpm (scripts/setup),
    # so apt does not pull in mod_php; its postinst enables dokuwiki.conf
    # in the system apache2, which the benchmarks do not use: switched off
    # again if it was off before.
    if ! dpkg-query -W -f='${Status}' dokuwiki 2>/dev/null | grep -q "ok installed"; then
        conf_was=$(ls /etc/apache2/conf-enabled/dokuwiki.conf 2>/dev/null || true)
        bench_apt_install dokuwiki php8.2-xml
        [ -n "$conf_was" ] || a2disconf -q dokuwiki >/dev/null 2>&1 || true
    fi
    pages=/var/lib/dokuwiki/data/pages
    mkdir -p "$pages/bench"
    {
        echo '~~NOCACHE~~'
        for _ in 1 2 3 4 5 6 7 8; do grep -v -E '\{\{rss>|\{\{https?:' "$pages/wiki/syntax.txt"; done
    } > "$pages/bench/heavy.txt"
    chown -R www-data:www-data "$pages/bench"
    dokuwiki_page=/dokuwiki/doku.php?id=bench:heavy
}

# WordPress from Debian's archive on a private MariaDB in DIR (its data in
# DIR/mysql, its socket in DIR/run, no network, on the server's cores
# ($server_cpus) beside httpd),
# configured as /etc/wordpress/config-s9-bench.php (httpd: SetEnv
# WORDPRESS_CONFIG s9-bench), with S9's heavy post (bench/s9-wordpress.php).
# Sets wordpress_page (under Alias /wordpress /usr/share/wordpress) and
# mariadb_pid; the caller stops the server (bench_mariadb_stop). As root.
bench_wordpress() {
    local dir=$1 id
    bench_apt_install wordpress wordpress-theme-twentytwentythree mariadb-server php8.2-mysql
    mkdir -p "$dir/run"; chown mysql "$dir/run"; chmod 755 "$dir"
    if [ ! -d "$dir/mysql/mysql" ]; then
        mariadb-install-db --no-defaults --user=mysql --datadir="$dir/mysql" \
            --auth-root-authentication-method=socket >"$dir/install.log" 2>&1
    fi
    taskset -c "${server_cpus:-1}" mariadbd --no-defaults --user=mysql --datadir="$dir/mysql" \
        --socket="$dir/run/mysql.sock" --pid-file="$dir/run/mysql.pid" --skip-networking \
        --log-error="$dir/run/mysql.err" --max-connections=400 >/dev/null 2>&1 &
    mariadb_pid=$!
    for _ in $(seq 300); do [ -S "$dir/run/mysql.sock" ] && break; sleep 0.1; done
    mariadb -S "$dir/run/mysql.sock" -u root -e "CREATE DATABASE IF NOT EXISTS s9;
        CREATE USER IF NOT EXISTS 's9'@'localhost' IDENTIFIED BY 's9';
        GRANT ALL ON s9.* TO 's9'@'localhost';"
    printf '%s\n' '<?php' "define('DB_NAME', 's9');" "define('DB_USER', 's9');" \
        "define('DB_PASSWORD', 's9');" "define('DB_HOST', 'localhost:$dir/run/mysql.sock');" \
        "define('WP_CONTENT_DIR', '/usr/share/wordpress/wp-content');" \
        "define('DISABLE_WP_CRON', true);" "define('WP_HTTP_BLOCK_EXTERNAL', true);" \
        "define('AUTOMATIC_UPDATER_DISABLED', true);" > /etc/wordpress/config-s9-bench.php
    chmod 644 /etc/wordpress/config-s9-bench.php
    id=$(php8.2 bench/s9-wordpress.php s9-bench | tail -1)
    wordpress_page="/wordpress/?p=$id"
}

# bench_mediawiki DIR PORT SECTIONS: MediaWiki from Debian's archive (with
# php8.2-sqlite3), a private wiki in DIR made anew by MediaWiki's own
# installer (maintenance/install.php): its SQLite database in DIR/db,
# DIR/LocalSettings.php (httpd: SetEnv MW_CONFIG_FILE DIR/LocalSettings.php;
# Alias /w /usr/share/mediawiki) with the parser cache off, the
# localisation cache in files and no jobs run by web requests; and S9's
# page "S9 heavy" of SECTIONS sections (bench_mediawiki_text). The
# installer and the edits run without a network where the kernel lets them
# (unshare -n), so that nothing is fetched. Sets mediawiki_page: the parse
# API's URL for the page. As root.
bench_mediawiki() {
    local dir=$1 port=$2 sections=$3 conf_was mw=/usr/share/mediawiki nonet=""
    conf_was=$(ls /etc/apache2/conf-enabled/mediawiki.conf 2>/dev/null || true)
    # php8.2-sqlite3 is one of the alternatives mediawiki depends on: named
    bench_apt_install mediawiki php8.2-sqlite3
    # its postinst enables mediawiki.conf in the system apache2, which the
    # benchmarks do not use: switched off again if it was off before
    [ -n "$conf_was" ] || a2disconf -q mediawiki >/dev/null 2>&1 || true
    unshare -n true 2>/dev/null && nonet="unshare -n"
    rm -rf "$dir"
    mkdir -p "$dir/db" "$dir/cache"
    chmod 755 "$dir"
    # shellcheck disable=SC2086  # $nonet: a command and its option, or nothing
    $nonet php8.2 "$mw/maintenance/install.php" --dbtype sqlite --dbpath "$dir/db" \
        --dbname s9wiki --server "http://127.0.0.1:$port" --scriptpath /w --confpath "$dir" \
        --pass "s9-bench-$RANDOM-$RANDOM" S9Wiki Admin > "$dir/install.log" 2>&1 ||
        { echo "bench_mediawiki: MediaWiki's installer failed: see $dir/install.log" >&2; exit 1; }
    # shellcheck disable=SC2016  # PHP's variables, written as they are
    printf '%s\n' '' '# S9: every parse request parses, localisation is read from files, and' \
        '# no job runs inside a web request' '$wgParserCacheType = CACHE_NONE;' \
        "\$wgCacheDirectory = \"$dir/cache\";" '$wgJobRunRate = 0;' >> "$dir/LocalSettings.php"
    # shellcheck disable=SC2086
    {
        MW_CONFIG_FILE=$dir/LocalSettings.php $nonet php8.2 \
            "$mw/maintenance/rebuildLocalisationCache.php" --lang en --force &&
        printf '%s\n' '{| class="wikitable" style="float:right"' '! colspan="3" | {{{title|Box}}}' \
            '|-' '| {{{1}}} || {{uc:{{{2|x}}}}} || {{formatnum:{{{3|0}}}}}' '|}' |
            MW_CONFIG_FILE=$dir/LocalSettings.php $nonet php8.2 "$mw/maintenance/edit.php" \
                --user Admin --summary S9 Template:S9box &&
        bench_mediawiki_text "$sections" |
            MW_CONFIG_FILE=$dir/LocalSettings.php $nonet php8.2 "$mw/maintenance/edit.php" \
                --user Admin --summary S9 "S9 heavy"
    } >> "$dir/install.log" 2>&1 ||
        { echo "bench_mediawiki: writing the wiki's pages failed: see $dir/install.log" >&2; exit 1; }
    chown -R www-data:www-data "$dir"
    mediawiki_page="/w/api.php?action=parse&format=json&page=S9_heavy&disablelimitreport=1"
}

# S9's MediaWiki page: SECTIONS sections, each with a template (S9box),
# paragraphs of links (to pages that do not exist, to a section, outside:
# rendered, never fetched) and magic words, nested lists and a table.
bench_mediawiki_text() {
    local i j
    for i in $(seq "$1"); do
        printf '== Section %d ==\n{{S9box|title=Box %d|item %d|value %d|%d}}\n' \
            "$i" "$i" "$i" "$i" $((i * 1234567))
        for j in 1 2 3 4; do
            printf "'''Bold %d.%d''' and ''italic'' words with [[Page %d %d]], " "$i" "$j" "$i" "$j"
            printf '[[S9 heavy#Section %d|a section]], [https://example.invalid/%d/%d a link outside], ' \
                "$i" "$i" "$j"
            printf '{{lc:MIXED Case %d}} and {{formatnum:%d}}.\n\n' "$i" $((i * j * 98765))
        done
        printf '* one\n** two [[Item %d]]\n*** three\n# first\n# second\n' "$i"
        printf '{| class="wikitable sortable"\n! a !! b !! c\n'
        for j in 1 2 3 4 5 6; do
            printf '|-\n| %d || [[Row %d %d]] || {{urlencode:%d and %d}}\n' "$j" "$i" "$j" "$i" "$j"
        done
        printf '|}\n'
    done
}

bench_mariadb_stop() {
    [ -n "${mariadb_pid:-}" ] || return 0
    kill -TERM "$mariadb_pid" 2>/dev/null || true
    wait "$mariadb_pid" 2>/dev/null || true
    mariadb_pid=""
}

# A child of our own memory cgroup (v1 or v2) of 1 GiB, no swap, named
# at-NAME-PID: sets cg, memf (its memory in use), cgversion, and defines
# oom_kills (kills in it so far). As root. The caller removes it (rmdir).
bench_memory_cgroup() {
    local own_v1 own_v2
    own_v1=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
    own_v2=$(awk -F: '$1 == "0" && $2 == "" {print $3}' /proc/self/cgroup)
    if [ -n "$own_v1" ] && [ -d "/sys/fs/cgroup/memory$own_v1" ]; then
        cg="/sys/fs/cgroup/memory${own_v1%/}/at-$1-$$"
        mkdir "$cg"
        echo $((1 << 30)) > "$cg/memory.limit_in_bytes"
        [ -f "$cg/memory.memsw.limit_in_bytes" ] && echo $((1 << 30)) > "$cg/memory.memsw.limit_in_bytes"
        echo 0 > "$cg/memory.swappiness" 2>/dev/null || true
        oom_kills() { awk '$1 == "oom_kill" {print $2}' "$cg/memory.oom_control"; }
        memf=$cg/memory.usage_in_bytes
        cgversion=v1
    else
        cg="/sys/fs/cgroup${own_v2%/}/at-$1-$$"
        mkdir "$cg"
        echo $((1 << 30)) > "$cg/memory.max"
        echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
        oom_kills() { awk '$1 == "oom_kill" {print $2}' "$cg/memory.events"; }
        memf=$cg/memory.current
        cgversion=v2
    fi
}

# Stops whatever of ours is left in the cgroup (the OOM killer may have
# taken httpd's parent): TERM to the parent, then KILL to the rest, by pid.
bench_cgroup_stop() {
    local pid
    pid=$(cat "$bench_dir/httpd.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
    # (cgroupfs files have no size: read them)
    for _ in $(seq 100); do [ -n "$(cat "$cg/cgroup.procs")" ] || break; sleep 0.1; done
    for pid in $(cat "$cg/cgroup.procs"); do kill -KILL "$pid" 2>/dev/null || true; done
    # a process reclaiming memory dies when it comes back from it
    for _ in $(seq 300); do [ -n "$(cat "$cg/cgroup.procs")" ] || break; sleep 0.1; done
    rm -f "$bench_dir/httpd.pid"
}
