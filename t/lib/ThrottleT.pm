package ThrottleT;
# Helpers for the integration tests: raw HTTP requests (so timing and
# disconnects are under the test's control), many at once from forked
# clients, and readers for what the probe CGI witnessed.
use strict;
use warnings;
use Exporter 'import';
use IO::Socket::INET;
use IO::Socket::IP;
use Storable qw(store retrieve);
use File::Spec;
use File::Temp qw(tempdir);
use File::Path qw(remove_tree);
use Time::HiRes qw(time sleep);
use Fcntl qw(:flock O_RDONLY O_CREAT);
use IO::Select;
use Digest::MD5 ();
use Apache::Test;
use Apache::TestRequest;

our @EXPORT = qw(http_get parallel_get bg_get bg_done bg_wait status_auto probe_count probe_count_in
                 probe_order probe_overlap_of probe_reset probe_release wait_until hostport server_pid
                 load_loop load_loop_ids restarts_seen private_server children_of
                 open_request server_process_of free_port cgi_conf agent_conf configtest
                 zone_stat
                 with_cpus stop_process test_seed);

sub hostport { Apache::TestRequest::hostport() }

sub probe_dir {
    my $dir = Apache::Test::vars('t_logs') . '/probe';
    unless (-d $dir) {
        mkdir $dir or die "mkdir $dir: $!";
        chmod 0777, $dir; # the CGIs run as nobody
    }
    $dir;
}

# from => '127.0.0.2' connects from another loopback address: another
# client, as far as the server can tell.
sub connect_server {
    my (%opt) = @_;
    my ($host, $port) = split /:/, hostport();
    ($host, $port) = ('127.0.0.1', $opt{port}) if $opt{port}; # a private server
    IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Proto => 'tcp',
                          Timeout => 10, ($opt{from} ? (LocalAddr => $opt{from}) : ()))
        or die "connect $host:$port: $!";
}

# GET $path; returns { status, headers (lower-case keys), body, secs }.
sub http_get {
    my ($path, %opt) = @_;
    my $t0 = time;
    my $sock = connect_server(%opt);
    my $extra = join '', map { "$_: $opt{headers}{$_}\r\n" } keys %{ $opt{headers} || {} };
    print $sock "GET $path HTTP/1.0\r\nHost: " . hostport() . "\r\n$extra\r\n";
    # Bounded, so that a request the server never answers fails its test
    # instead of hanging the suite (status 0).
    my ($raw, $deadline, $sel) = ('', $t0 + ($opt{timeout} // 60), IO::Select->new($sock));
    while ((my $left = $deadline - time) > 0) {
        last unless $sel->can_read($left);
        last unless sysread($sock, $raw, 65536, length $raw);
    }
    close $sock;
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    my ($status) = ($head // '') =~ m{^HTTP/\d\.\d (\d+)};
    my %h;
    for (split /\r\n/, $head // '') {
        $h{lc $1} = $2 if /^([^:]+):\s*(.*)$/;
    }
    return { status => $status // 0, headers => \%h, body => $body // '',
             secs => time - $t0 };
}

my $bg_dir;
sub bg_get {
    my ($path, %opt) = @_;
    $bg_dir //= tempdir(CLEANUP => 1);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my $r = eval { http_get($path, %opt) } || { status => 0, error => "$@" };
        store($r, "$bg_dir/$$");
        require POSIX;
        POSIX::_exit(0);
    }
    return $pid;
}

# Whether the request of bg_get's $pid has its answer, without waiting.
my %bg_reaped;
sub bg_done {
    my ($pid) = @_;
    require POSIX;
    $bg_reaped{$pid} = 1 if !$bg_reaped{$pid} && waitpid($pid, POSIX::WNOHANG()) == $pid;
    return $bg_reaped{$pid} // 0;
}

sub bg_wait {
    my ($pid) = @_;
    waitpid($pid, 0) unless delete $bg_reaped{$pid};
    my $f = "$bg_dir/$pid";
    return -f $f ? retrieve($f) : { status => 0, error => 'no result' };
}

# Start all paths at once; returns results in the same order.
sub parallel_get {
    my (@paths) = @_;
    my @pids = map { bg_get($_) } @paths;
    return map { bg_wait($_) } @pids;
}

# The status page as a hash. A connection that a child took from the listen
# queue just before it was SIGKILLed (or ended by a restart) closes without
# an answer: ask again, for up to a second, rather than hand a test an empty
# page (kill.t under worker read an undefined count once in CI).
sub status_auto {
    my ($r, $err);
    for my $try (1 .. 20) {
        $r = eval { http_get('/throttle-status?auto') } || { status => 0 };
        $err = $@;
        last if $r->{status} == 200;
        sleep 0.05;
    }
    die "the status page did not answer 200 in 20 tries: status $r->{status} $err"
        unless $r->{status} == 200;
    my %s;
    for (split /\n/, $r->{body}) {
        $s{$1} = $2 if /^([^:]+):\s*(.*)$/;
    }
    return \%s;
}

# The tags this test file reset: a test that dies releases their holders
# as it ends, rather than leave them holding slots for up to a minute.
my (%reset_tags, $reset_by);
sub probe_reset {
    my ($tag) = @_;
    my $dir = probe_dir();
    unlink "$dir/$tag.count", "$dir/$tag.order", "$dir/$tag.events", "$dir/$tag.release";
    $reset_by //= $$;
    $reset_tags{$tag} = 1;
}
END {
    if (defined $reset_by && $$ == $reset_by) {
        local $?; # the test's exit status stays its own
        eval { probe_release($_) } for keys %reset_tags;
    }
}

# Ends the sleep of the probe CGIs of $tag that run with release=1 (in
# $dir, the suite's probe directory by default): a holder that lasts as long
# as the test needs, however slow the machine, and no longer.
sub probe_release {
    my ($tag, $dir) = @_;
    open(my $fh, '>', ($dir // probe_dir()) . "/$tag.release") or die "$tag.release: $!";
    close $fh;
}

# (running now, highest ever) as counted by the CGIs themselves, read under
# the CGIs' own lock: a CGI truncates the file before it writes the new count,
# and an unlocked reader caught between the two reads nothing (once in CI).
sub probe_count_in {
    my ($dir, $tag) = @_;
    open(my $fh, '<', "$dir/$tag.count") or return (0, 0);
    flock($fh, LOCK_SH) or die "flock $dir/$tag.count: $!";
    my ($cur, $max) = split ' ', (<$fh> // '0 0');
    return ($cur // 0, $max // 0);
}

sub probe_count { probe_count_in(probe_dir(), $_[0]) }

# [id, cgi pid, httpd pid] per started CGI, in start order (in $dir, the
# suite's probe directory by default).
sub probe_order {
    my ($tag, $dir) = @_;
    open(my $fh, '<', ($dir // probe_dir()) . "/$tag.order") or return ();
    return map { [split ' '] } <$fh>;
}

# How often wait_until asks: a test whose states change more slowly (and
# whose condition is costly to ask) may set it higher.
our $POLL = 0.02;

sub wait_until {
    my ($cond, $secs) = @_;
    my $end = time + ($secs // 10);
    while (time < $end) {
        return 1 if $cond->();
        sleep $POLL;
    }
    return $cond->() ? 1 : 0;
}

sub server_pid {
    my $file = Apache::Test::vars('t_pid_file');
    open(my $fh, '<', $file) or die "$file: $!";
    my $pid = <$fh>;
    chomp $pid;
    return $pid;
}

# $clients clients each request $path in a loop for $secs seconds, or until
# the file $stop exists if one is named; returns every status seen (0 for a
# failed connection). load_loop_ids returns [id, status] instead: each
# request carries id=c<client>n<count> for probe.cgi to record.
sub load_loop { map { $_->[1] } load_loop_ids(@_) }

sub load_loop_ids {
    my ($path, $clients, $secs, $stop) = @_;
    # Removed here, not at exit: a caller may run this in a child that
    # leaves by POSIX::_exit, which skips File::Temp's cleanup.
    my $dir = tempdir();
    my $sep = $path =~ /\?/ ? '&' : '?';
    my @pids;
    for my $c (1 .. $clients) {
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            my $end = time + $secs;
            my @st;
            while (time < $end && !(defined $stop && -e $stop)) {
                my $id = "c${c}n" . scalar(@st);
                my $r = eval { http_get("$path${sep}id=$id") } || { status => 0 };
                push @st, [$id, $r->{status}];
            }
            store(\@st, "$dir/$$");
            require POSIX;
            POSIX::_exit(0);
        }
        push @pids, $pid;
    }
    my @all;
    for (@pids) {
        waitpid($_, 0);
        push @all, @{ retrieve("$dir/$_") };
    }
    remove_tree($dir);
    return @all;
}

# The most copies of probe.cgi (tag $tag) that ran at once, counting only
# those whose request ids are in %$answered. mod_cgid can give up on a CGI
# it has started (it loses the cgi daemon at a graceful restart: AH10246,
# a 503 of its own) and the CGI runs on, out of any slot: such a CGI is no
# request the module let in.
sub probe_overlap_of {
    my ($tag, $answered) = @_;
    my %mine = map { $_->[1] => 1 } grep { $answered->{$_->[0]} } probe_order($tag);
    open(my $fh, '<', probe_dir() . "/$tag.events") or return 0;
    my ($n, $max) = (0, 0);
    for (<$fh>) {
        my ($sign, $t, $pid) = split ' ';
        next unless $mine{$pid};
        $n += $sign eq '+' ? 1 : -1;
        $max = $n if $n > $max;
    }
    return $max;
}

# How many times the server has finished a (re)start, from its error log.
sub restarts_seen {
    open(my $fh, '<', Apache::Test::vars('t_logs') . '/error_log') or return 0;
    return scalar grep { /resuming normal operations/ } <$fh>;
}

# A second, private httpd on a free loopback port, with the modules of the
# suite's own configuration (minus those named in $opt{without}) and the
# given configuration lines; it is up when $opt{ready} (default /hello.txt)
# answers 200; $opt{cgi_not_cgid} loads mod_cgi where the suite has
# mod_cgid; $opt{env} adds variables to the server's environment. Returns
# { dir, port, pid, get(path), stop(), log() }. It is stopped by pid, and
# only by the test that started it.
# A TCP port free on 127.0.0.1 now.
# Runs $code with the machine's CPUs to this suite alone among the suites
# t/run-apache-tests runs side by side (it names a lock file in AT_CPU_LOCK):
# a test that measures what CPU-bound work does to limit=auto needs the
# CPUs it counts, not a share of them with other CPU-burning tests.
sub with_cpus {
    my ($code) = @_;
    my $lock;
    if ($ENV{AT_CPU_LOCK}) {
        open($lock, '>>', $ENV{AT_CPU_LOCK}) or die "$ENV{AT_CPU_LOCK}: $!";
        flock($lock, LOCK_EX) or die "flock: $!";
    }
    my @r = $code->();
    close $lock if $lock;
    return @r;
}

# SIGSTOP, as a debugger does, and wait until every thread of the process
# has stopped: kill() returns before they have, and a thread still running
# could take one more connection from the listener meanwhile.
sub stop_process {
    my ($pid) = @_;
    kill 'STOP', $pid or die "SIGSTOP $pid: $!";
    my $stopped = sub {
        my @t = glob "/proc/$pid/task/*/stat";
        return @t && !grep { (do { local (@ARGV, $/) = ($_); <> } // '') !~ /^\d+ \(.*\) [Tt] / } @t;
    };
    wait_until($stopped, 10) or die "process $pid did not stop";
}

# The seed of a test's random choices: $ENV{$var} replays a run, else
# AT_TEST_SEED (CI derives one from the commit), else a new one. Returns it
# with the command that replays the run, for the test to print on failure.
sub test_seed {
    my ($var) = @_;
    my $given = $ENV{$var} // $ENV{AT_TEST_SEED};
    my $seed = !defined $given ? int(rand(1 << 30))
             : $given =~ /^\d+$/ ? $given % (1 << 30)
             : unpack('N', Digest::MD5::md5($given)) % (1 << 30);
    (my $test = $0) =~ s{.*/}{};
    return ($seed, "$var=$seed MPMS=" . ($ENV{MPM} // 'event')
                   . " MODULE_SO=.libs/mod_adaptive_throttle_test.so t/run-apache-tests t/$test"
                   . ' (CI runs it on a build with --enable-sanitizers)');
}

# A port for a server of the test's own, that no other test (the suites of
# the other MPMs run at the same time) is given while this process lives:
# outside the kernel's ephemeral range, which bind() to port 0 and every
# outgoing connection draw from, and reserved by a lock on a file of its
# own, held until this process and its forked clients have exited.
my @port_locks;
sub free_port {
    my ($host) = @_; # default 127.0.0.1; '::1' for IPv6 loopback
    $host //= '127.0.0.1';
    my ($eph_lo, $eph_hi) = (32768, 60999);
    if (open my $r, '<', '/proc/sys/net/ipv4/ip_local_port_range') {
        ($eph_lo, $eph_hi) = split ' ', scalar <$r>;
    }
    my $dir = File::Spec->tmpdir . '/mod_adaptive_throttle-test-ports';
    mkdir $dir;
    chmod 01777, $dir if -o $dir;
    my ($base, $span) = (20000, 10000);
    my $first = int(rand $span);
    for my $i (0 .. $span - 1) {
        my $port = $base + ($first + $i) % $span;
        next if $port >= $eph_lo && $port <= $eph_hi;
        # read-only: another user's file of the same name locks as well
        sysopen my $lock, "$dir/$port", O_RDONLY | O_CREAT, 0644 or next;
        unless (flock $lock, LOCK_EX | LOCK_NB) {
            close $lock;
            next;
        }
        # free now, as httpd will bind it (SO_REUSEADDR: TIME_WAIT is no bar)
        my $s = IO::Socket::IP->new(LocalHost => $host, LocalPort => $port,
                                    Listen => 1, ReuseAddr => 1);
        unless ($s) {
            close $lock;
            next;
        }
        close $s;
        push @port_locks, $lock;
        return $port;
    }
    die "no free port between $base and " . ($base + $span - 1);
}

# Configuration lines for a private server: the suite's CGIs (probe.cgi
# and the others) under each of @aliases (default /cgi-bin/), witnessing
# into $probes.
sub cgi_conf {
    my ($probes, @aliases) = @_;
    my $cgi = Apache::Test::vars('serverroot') . '/cgi-bin';
    return join '', "SetEnv PROBE_DIR $probes\n<Directory \"$cgi\">\n",
        "    Options +ExecCGI\n    Require all granted\n</Directory>\n",
        map { "ScriptAlias $_ \"$cgi/\"\n" } @aliases ? @aliases : ('/cgi-bin/');
}

# A virtual host of its own on 127.0.0.1:$port answering the agent-check
# for $zone.
sub agent_conf {
    my ($port, $zone) = @_;
    return "Listen 127.0.0.1:$port\n<VirtualHost 127.0.0.1:$port>\n"
         . "    ThrottleAgent $zone\n</VirtualHost>\n";
}

# httpd -t on $conf pasted into a minimal server with the suite's modules
# and mod_proxy_fcgi: '' when it passes, else what httpd said.
sub configtest {
    my ($conf) = @_;
    my $inherit = $ENV{INHERIT_CONF} or die 'INHERIT_CONF not set';
    my $httpd = $ENV{HTTPD} || Apache::Test::vars('httpd');
    my $apxs = $ENV{APXS} || 'apxs';
    chomp(my $moddir = `$apxs -q LIBEXECDIR`);
    my $dir = tempdir(CLEANUP => 1);
    open my $in, '<', $inherit or die "$inherit: $!";
    my @modules = <$in>;
    push @modules, "LoadModule proxy_fcgi_module $moddir/mod_proxy_fcgi.so\n"
        unless grep { /proxy_fcgi/ } @modules;
    open my $fh, '>', "$dir/httpd.conf" or die;
    print $fh @modules, "ServerRoot $dir\nServerName 127.0.0.1\nListen 127.0.0.1:1\n",
        "DocumentRoot $dir\nDefaultRuntimeDir $dir\nPidFile $dir/pid\n",
        "ErrorLog $dir/error_log\n", $conf;
    close $fh;
    my $out = `$httpd -t -d $dir -f $dir/httpd.conf 2>&1`;
    return $? == 0 ? '' : $out || "httpd -t exited $?";
}

# Each process's /proc/PID/$name read whole: (pid, text) pairs; a process
# gone meanwhile is left out.
sub proc_files {
    my ($name) = @_;
    my @out;
    for my $f (glob "/proc/[0-9]*/$name") {
        open(my $fh, '<', $f) or next;
        my $text = do { local $/; <$fh> } // next;
        push @out, [ $f =~ m{^/proc/(\d+)/}, $text ];
    }
    return @out;
}

# Every process running with a private server's directory on its command
# line: its parent, its children, and children left by a parent killed.
sub processes_in_dir {
    my ($dir) = @_;
    return map { $_->[0] } grep { index($_->[1], "\0-d\0$dir\0") >= 0 } proc_files('cmdline');
}

# Servers started by this test, stopped at its end even if it dies midway
# (by the process that started them, not by forked clients). A parent
# takes its children with it; what is left once the parents are gone
# (children orphaned by a test that killed their parent) is killed.
our @private_servers;
END {
    local $?;
    my @mine = grep { $_->{owner} == $$ } @private_servers;
    my @parents;
    for my $srv (@mine) {
        # the recorded pid, if it is still this server's (not one reused)
        next unless $srv->{pid} && grep { $_ == $srv->{pid} } processes_in_dir($srv->{dir});
        kill 'TERM', $srv->{pid};
        push @parents, $srv->{pid};
    }
    wait_until(sub { !grep { kill 0, $_ } @parents }, 10);
    kill 'KILL', map { processes_in_dir($_->{dir}) } @mine;
}

sub private_server {
    my ($conf, %opt) = @_;
    my $inherit = $ENV{INHERIT_CONF} or die 'INHERIT_CONF not set';
    my $httpd = $ENV{HTTPD} || Apache::Test::vars('httpd');
    my $dir = tempdir(CLEANUP => !$ENV{KEEP});
    chmod 0755, $dir;
    my $port = free_port();
    open my $in, '<', $inherit or die;
    my @modules = <$in>;
    for my $m (@{ $opt{without} || [] }) {
        @modules = grep { !/mod_\Q$m\E\.so/ } @modules;
    }
    # mod_cgi in place of mod_cgid: mod_cgid's daemon is restarted by every
    # graceful restart, and requests caught in that moment fail in mod_cgid.
    if ($opt{cgi_not_cgid}) {
        s/\bcgid_module\b/cgi_module/, s/mod_cgid\.so/mod_cgi.so/ for @modules;
    }
    # $opt{module}: this module's build from another file.
    if ($opt{module}) {
        s/^(LoadModule adaptive_throttle_module) .*/$1 $opt{module}/ for @modules;
    }
    open my $fh, '>', "$dir/httpd.conf" or die;
    print $fh @modules, <<"CONF", $conf, "\n";
ServerRoot $dir
ServerName 127.0.0.1
Listen 127.0.0.1:$port
PidFile $dir/httpd.pid
ErrorLog $dir/error_log
DefaultRuntimeDir $dir
TypesConfig /dev/null
User nobody
Group nogroup
DocumentRoot $dir
<Directory $dir>
    Require all granted
</Directory>
CONF
    close $fh;
    open my $doc, '>', "$dir/hello.txt" or die;
    print $doc "hello\n";
    close $doc;
    chmod 0644, "$dir/hello.txt";
    my $read = sub { my $f = shift; local (@ARGV, $/) = ($f); -f $f ? <> : '' };
    # The suite's memory cgroup layout is for the main server's mem= zones;
    # $opt{env} sets the private server's own.
    local $ENV{MOD_ADAPTIVE_THROTTLE_TEST_MEM_ROOT};
    delete $ENV{MOD_ADAPTIVE_THROTTLE_TEST_MEM_ROOT};
    local @ENV{keys %{ $opt{env} || {} }} = values %{ $opt{env} || {} };
    system($httpd, '-d', $dir, '-f', "$dir/httpd.conf", '-k', 'start') == 0
        or die 'private httpd did not start: ' . $read->("$dir/error_log");
    my $srv = { dir => $dir, port => $port, owner => $$ };
    push @private_servers, $srv;
    wait_until(sub { -s "$dir/httpd.pid" }, 10) or die 'no pid file';
    ($srv->{pid} = $read->("$dir/httpd.pid")) =~ s/\s+//g;
    $srv->{get} = sub {
        my ($path) = @_;
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                      Timeout => 10) or return { status => 0 };
        print $s "GET $path HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        local $/;
        my $raw = <$s> // '';
        my ($status) = $raw =~ m{^HTTP/\S+ (\d+)};
        my (undef, $body) = split /\r\n\r\n/, $raw, 2;
        return { status => $status // 0, body => $body // '', raw => $raw };
    };
    my $ready = $opt{ready} // '/hello.txt';
    wait_until(sub { $srv->{get}->($ready)->{status} == 200 }, 10)
        or die 'private httpd does not answer';
    $srv->{log} = sub { $read->("$dir/error_log") };
    $srv->{stop} = sub {
        # The event MPM closes a connection after the answer (lingering
        # close) from its pollset; a child told to stop then may find the
        # pollset gone and log AH03092 (apr_pollset_add: Bad file
        # descriptor), an error of httpd's own shutdown that would fail
        # tests asserting a clean log. Let the last connections close first.
        wait_until(sub { !open_connections($port) }, 2);
        kill 'TERM', $srv->{pid};
        wait_until(sub { !kill 0, $srv->{pid} }, 15);
    };
    return $srv;
}

# A counter of a private server's zone, from its status page at /ts
# (SetHandler throttle-status); -1 if the page does not show it.
sub zone_stat {
    my ($srv, $zone, $key) = @_;
    return ($srv->{get}->('/ts?auto')->{body} =~ /^Throttle\.\Q$zone\E\.\Q$key\E: (\d+)$/m)[0] // -1;
}

# A request sent on a connection the caller keeps (to close it, or to read
# the answer later).
sub open_request {
    my ($path, %opt) = @_;
    my $s = connect_server(%opt);
    print $s "GET $path HTTP/1.0\r\nHost: " . hostport() . "\r\n\r\n";
    return $s;
}

# The server process holding the other end of a client socket: the
# connection's inode from /proc/net/tcp, then the process with that inode
# among its open files. Needs root, as the suite runs.
sub server_process_of {
    my ($sock) = @_;
    my $want = sprintf ':%04X', $sock->sockport;
    my $server = sprintf ':%04X', $sock->peerport;
    my $inode;
    open my $fh, '<', '/proc/net/tcp' or return;
    while (<$fh>) {
        my @f = split;
        next unless @f > 9 && $f[1] =~ /\Q$server\E$/ && $f[2] =~ /\Q$want\E$/;
        $inode = $f[9];
        last;
    }
    return unless $inode;
    for my $fd (glob '/proc/[0-9]*/fd/*') {
        my $l = readlink($fd) // next;
        return ($fd =~ m{^/proc/(\d+)/})[0] if $l eq "socket:[$inode]";
    }
    return;
}

# How many connections to a local port some process still holds: those
# in /proc/net/tcp, but for the listener and TIME_WAIT (the kernel's alone).
sub open_connections {
    my ($port) = @_;
    my $local = sprintf ':%04X', $port;
    my $n = 0;
    open my $fh, '<', '/proc/net/tcp' or return 0;
    while (<$fh>) {
        my @f = split;
        $n++ if @f > 3 && $f[1] =~ /\Q$local\E$/ && $f[3] ne '0A' && $f[3] ne '06';
    }
    return $n;
}

# Child processes of a pid, from /proc.
sub children_of {
    my ($ppid) = @_;
    return map { $_->[0] } grep { $_->[1] =~ /^\d+ \(.*\) \S (\d+) / && $1 == $ppid }
        proc_files('stat');
}

probe_dir() if Apache::Test::vars('t_logs') && -d Apache::Test::vars('t_logs');

1;
