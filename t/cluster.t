# cluster=: three private httpds share one zone's limit through a private
# redis-server. The CGIs count themselves in one directory for the whole
# fleet, so the count is the fleet's, measured from outside the module: it
# never exceeds the total while Redis answers; load on one server only
# moves nearly all the total there; with Redis stopped each server runs
# its cluster_fallback=, and says why once; with Redis back the shares come
# back. Children retiring, graceful restarts and a graceful stop under load
# keep the fleet within the total (the sync runs in a process of the
# parent's, not in a child). No CGI inherits a connection to Redis. A
# restart that raises the total beyond the zone's memory lays it anew. Bad
# configurations fail at configtest. A stop takes the server's row out of
# Redis at once; restarts keep it, and the id. The sync process holds no descriptor of
# the parent's but the logs; killed, it is started again, backing off, its
# first death logged only; signals from others than the parent are
# ignored. The parent killed with a CGI running: the
# orphaned children refuse, the row is held until the CGI ends, then the
# sync process leaves and exits.
# The fleet under load runs under the event MPM only (the rest under every
# MPM): it is most of the suite's CPU; what it checks of the children (a
# zone's cap, retiring, restarts) the other files check under every MPM,
# and what it checks of the sync process (Redis down and back, its logs,
# no inherited connection) does not depend on the MPM. Stops, graceful
# ones included, run under every MPM.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use POSIX ();
use Time::HiRes qw(time sleep);
use IO::Select;
use IO::Socket::INET;

my $redis = (grep { -x } map { "$_/redis-server" } split(/:/, $ENV{PATH}), '/usr/bin')[0];
plan tests => 49, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                         'redis-server (scripts/setup installs it)' => $redis };

my $work = tempdir(CLEANUP => 1);
chmod 0755, $work;

# ---- configuration errors, at configtest ----
my $pwfile = "$work/no-such-password";
my %bad = (
    'unknown cluster' => ["ThrottleZone z limit=4 cluster=nosuch\n", qr/names no ThrottleCluster/],
    'bad URL' => ["ThrottleCluster c http://127.0.0.1:1/0\n", qr/redis:\/\/HOST/],
    'unreadable password file' => ["ThrottleCluster c redis://127.0.0.1:1/0 password_file=$pwfile\n",
                                   qr/cannot read password_file/],
    'cluster= with per_client' => ["ThrottleCluster c redis://127.0.0.1:1/0\n"
                                   . "ThrottleZone z limit=4 per_client=1 cluster=c\n",
                                   qr/per_client counts on this server only/],
);
for my $case (sort keys %bad) {
    my ($conf, $re) = @{ $bad{$case} };
    my $out = configtest($conf);
    ok t_cmp($out, $re, "configtest refuses: $case");
}

# ---- a private Redis ----
my $rport = free_port();
my $rdir = "$work/redis";
mkdir $rdir;
sub redis_start {
    system($redis, '--port', $rport, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
           '--dir', $rdir, '--daemonize', 'yes', '--pidfile', "$rdir/redis.pid",
           '--logfile', "$rdir/redis.log") == 0 or die "redis-server did not start";
    wait_until(sub { -s "$rdir/redis.pid" }, 10) or die 'no redis pid file';
}
sub redis_pid {
    open my $fh, '<', "$rdir/redis.pid" or return;
    my $pid = <$fh>;
    chomp $pid;
    return $pid;
}
sub redis_stop {
    my $pid = redis_pid() or return;
    kill 'TERM', $pid;
    wait_until(sub { !kill 0, $pid }, 10);
    unlink "$rdir/redis.pid";
}
END { redis_stop() if $rport && -e "$rdir/redis.pid" }
redis_start();

# Redis spoken to directly: one command, its reply (an array ref for a
# list, undef for nil).
sub redis_reply {
    my ($c) = @_;
    my $line = <$c> // die 'no answer from Redis';
    $line =~ s/\r\n\z//;
    my ($type, $v) = (substr($line, 0, 1), substr($line, 1));
    die "Redis: $v" if $type eq '-';
    return $v if $type eq '+' || $type eq ':';
    return undef if $v < 0;
    return [map { redis_reply($c) } 1 .. $v] if $type eq '*';
    read($c, my $bulk, $v + 2) == $v + 2 or die 'short answer from Redis';
    return substr($bulk, 0, $v);
}
sub redis_connect {
    return IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $rport, Timeout => 5)
        // die "cannot connect to Redis: $!";
}
sub redis_cmd {
    my $c = redis_connect();
    print $c '*' . @_ . "\r\n", map { '$' . length($_) . "\r\n$_\r\n" } @_;
    return redis_reply($c);
}
sub redis_ms { my $t = redis_cmd('TIME'); $t->[0] * 1000 + int($t->[1] / 1000) }

# ---- three servers, one cluster zone of 6 ----
my $total = 6;
my $probes = "$work/probes";
mkdir $probes;
chmod 0777, $probes;
sub member_conf {
    my ($limit, $prefix, $period, $timeout) = @_;
    $period //= '200ms';
    $timeout //= '50ms';
    # Timeout: a CGI that waits for its release (silent after its headers)
    # outlives a stall of minutes, not only mod_cgi's default 60 s
    return cgi_conf($probes) . <<"CONF";
Timeout 600
ThrottleCluster fleet redis://127.0.0.1:$rport/0 period=$period timeout=$timeout prefix=$prefix
ThrottleZone cz limit=$limit queue=100 timeout=60s cluster=fleet cluster_fallback=1
<Location /cgi-bin/>
    Throttle cz
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
}
sub member {
    # mod_cgi: mod_cgid's daemon restarts with a graceful restart, and the
    # requests of that moment would fail rather than run; and a CGI is
    # then forked by the child that serves it, whose descriptors it sees
    return private_server(member_conf($total, "t$rport"), cgi_not_cgid => 1);
}
# The shares change once a sync period (200 ms), and asking costs a request
# to each server: asked every 100 ms.
$ThrottleT::POLL = 0.1;
my $grew;

# ---- the fleet under load: under the event MPM only ----
# Three servers loaded with CGIs, Redis stopped and back, children retiring
# and graceful restarts: nearly all of the file's CPU is here (see the top).
# What follows the block runs under every MPM.
my $fleet_checks = 23;
if (($ENV{MPM} // '') eq 'event') {
    my @s = map { member() } 1 .. 3;

    sub stat_of { zone_stat($_[0], 'cz', $_[1]) }

    ok t_cmp(wait_until(sub { !grep { stat_of($_, 'ClusterMembers') != 3 } @s }, 20), 1,
             'each server sees the three members: '
             . join(' ', map { stat_of($_, 'ClusterMembers') } @s));

    # Clients on $srv for $secs: each asks for a probe that sleeps $ms, counted
    # under $tag (fleet unless told).
    sub load {
        my ($srvs, $clients, $secs, $ms, $tag) = @_;
        $tag //= 'fleet';
        my @pids;
        for my $srv (@$srvs) {
            for my $c (1 .. $clients) {
                my $pid = fork // die "fork: $!";
                if (!$pid) {
                    my $end = time + $secs;
                    $srv->{get}->("/cgi-bin/probe.cgi?tag=$tag&sleep=$ms") while time < $end;
                    POSIX::_exit(0);
                }
                push @pids, $pid;
            }
        }
        return @pids;
    }
    sub reap { waitpid $_, 0 for @_ }

    # No CGI inherits a connection to Redis: the sockets a CGI holds, looked up
    # in /proc/net/tcp, none with Redis's port at its other end. Many requests
    # on each server, so that the CGIs run in every child.
    sub redis_sockets {
        my $peer = sprintf ':%04X', $rport;
        my %inode;
        for my $table ('/proc/net/tcp', '/proc/net/tcp6') {
            open my $fh, '<', $table or next;
            while (<$fh>) {
                my @f = split;
                $inode{$f[9]} = 1 if @f > 9 && $f[2] =~ /\Q$peer\E$/;
            }
        }
        return \%inode;
    }
    my ($seen, $inherited) = (0, 0);
    for my $srv (@s) {
        my @l = load([$srv], 4, 2, 0, 'fdload');
        for (1 .. 30) {
            my $body = $srv->{get}->('/cgi-bin/fds.cgi')->{body};
            my $redis = redis_sockets();
            for my $line (split /\n/, $body) {
                $seen++;
                $inherited++ if $line =~ /socket:\[(\d+)\]/ && $redis->{$1};
            }
        }
        reap(@l);
    }
    ok t_cmp($seen > 0 && $inherited == 0 ? 1 : 0, 1,
             "no CGI inherits a connection to Redis ($inherited of $seen descriptors are)");

    # Load on one server only: its share grows to nearly all of the total.
    my @l = load([$s[0]], 10, 8, 200);
    $grew = wait_until(sub { stat_of($s[0], 'Limit') >= $total - 2 }, 15);
    ok t_cmp($grew, 1, 'load on one server only: its share grows to the total less the '
             . 'floors: limits ' . join(' ', map { stat_of($_, 'Limit') } @s));
    reap(@l);
    my (undef, $max) = probe_count_in($probes, 'fleet');
    ok t_cmp($max <= $total ? 1 : 0, 1, "the fleet never ran more than $total at once (ran $max)");
    # The cap checks above and below would pass if nothing ran: something did,
    # more than the one request a server's floor lets it start.
    ok t_cmp($max >= 3 ? 1 : 0, 1, "the loaded server ran several at once ($max): not all refused");

    # Load on all three: still never more than the total.
    @l = load(\@s, 5, 6, 200);
    reap(@l);
    (undef, $max) = probe_count_in($probes, 'fleet');
    ok t_cmp($max <= $total ? 1 : 0, 1,
             "load on every server: never more than $total at once (ran $max)");
    my $sum = 0;
    $sum += stat_of($_, 'ClusterShare') for @s;
    ok t_cmp($sum <= $total ? 1 : 0, 1, "the shares Redis holds sum to $total at most ($sum)");

    # A graceful restart of one server under load: it keeps its share and its
    # name in Redis (the parent's pid), and the fleet stays within the total.
    @l = load(\@s, 4, 5, 200);
    sleep 1;
    kill 'USR1', $s[0]{pid};
    reap(@l);
    (undef, $max) = probe_count_in($probes, 'fleet');
    ok t_cmp($max <= $total ? 1 : 0, 1,
             "a graceful restart under load: never more than $total at once (ran $max)");
    ok t_cmp(wait_until(sub { !grep { stat_of($_, 'ClusterMembers') != 3
                                      || stat_of($_, 'ClusterSyncOk') != 1 } @s }, 15), 1,
             'after it, three members still, all syncing: '
             . join(' ', map { stat_of($_, 'ClusterMembers') } @s));

    # Redis stopped: each server runs its fallback once its lease is out.
    redis_stop();
    ok t_cmp(wait_until(sub { !grep { stat_of($_, 'ClusterFallback') != 1 } @s }, 10), 1,
             'Redis stopped: every server falls back');
    ok t_cmp(join(' ', map { stat_of($_, 'Limit') } @s), '1 1 1',
             'the fallback is cluster_fallback=1');
    ok t_cmp(join(' ', map { stat_of($_, 'ClusterSyncOk') } @s), '0 0 0',
             'the status page shows the failed sync');
    # A warning with the error's text at the first failure of a run, and a
    # notice when a sync succeeds again: so every run of failures, including
    # a slow sync's on a loaded machine, logs one of each, and the outage one
    # warning still open (not one every period).
    my $failed_re = qr/\[\S*:warn\].*the sync with Redis failed: \w/;
    my $back_re = qr/\[\S*:notice\].*the sync with Redis works again/;
    sub count_in_log {
        my ($srv, $re, $from) = @_;
        return scalar(() = substr($srv->{log}->(), $from // 0) =~ /$re/g);
    }
    my @open = map { count_in_log($_, $failed_re) - count_in_log($_, $back_re) } @s;
    ok t_cmp("@open", '1 1 1', 'each server logs the failure once, at warning, with '
             . "Redis's error: " . (($s[0]{log}->() =~ /the sync with Redis failed: ([^(]*)/)[0]
                                    // 'none logged')
             . '(runs of failures logged: ' . join(' ', map { count_in_log($_, $failed_re) } @s)
             . ')')
        or print STDERR map { "# cluster.t: server $_: failures less recoveries $open[$_]: "
                              . join(' | ', $s[$_]{log}->() =~ /(the sync with Redis \S+ [^(]*)/g)
                              . "\n" } 0 .. $#s;

    # Redis back (empty): the shares come back, and follow the load again.
    my @mark = map { length $_->{log}->() } @s;
    redis_start();
    ok t_cmp(wait_until(sub { !grep { stat_of($_, 'ClusterFallback') != 0 } @s }, 15), 1,
             'Redis back: no server runs its fallback');
    my @back = map { count_in_log($s[$_], $back_re, $mark[$_]) >= 1
                     && count_in_log($s[$_], $failed_re) - count_in_log($s[$_], $back_re) <= 1
                     ? 1 : 0 } 0 .. $#s;
    ok t_cmp("@back", '1 1 1', 'each server logs the recovery as a notice, once a run');
    @l = load([$s[1]], 10, 8, 200);
    ok t_cmp(wait_until(sub { stat_of($s[1], 'Limit') >= $total - 2 }, 15), 1,
             'Redis back: the shares follow the load again: limits '
             . join(' ', map { stat_of($_, 'Limit') } @s));
    reap(@l);
    (undef, $max) = probe_count_in($probes, 'fleet');
    ok t_cmp($max <= $total ? 1 : 0, 1, "in all, never more than $total at once (ran $max)");

    # Children retiring under load, and graceful restarts: every child of the
    # first server retires after 1 connection, the second restarts gracefully
    # every 1.5 s, all three loaded with more than the total. The share of a
    # server whose syncing stopped would go to the others after a lease (2 s)
    # while it still ran it.
    sub set_conf {
        my ($srv, $extra) = @_;
        open my $fh, '>>', "$srv->{dir}/httpd.conf" or die;
        print $fh "$extra\n";
        close $fh;
        kill 'USR1', $srv->{pid};
    }
    set_conf($s[0], 'MaxConnectionsPerChild 1');
    @l = (load([$s[0]], 8, 12, 300, 'churn'), load([@s[1, 2]], 5, 12, 300, 'churn'));
    my $restarts = 0;
    for (1 .. 7) {
        sleep 1.5;
        kill 'USR1', $s[1]{pid};
        $restarts++;
    }
    reap(@l);
    (undef, $max) = probe_count_in($probes, 'churn');
    ok t_cmp($max <= $total ? 1 : 0, 1, "children retiring after 1 connection and $restarts "
             . "graceful restarts under load: never more than $total at once (ran $max)");
    # (on a loaded machine, with a fork per connection, it may not come near
    # its total: 2 at once shows it did not refuse all)
    ok t_cmp($max >= 2 ? 1 : 0, 1, "and the fleet ran several at once ($max): not all refused")
        or print STDERR "# cluster.t: the churn ran at most $max at once\n";

    # A graceful stop under load: the third server's requests (5 s each) run
    # to their end after it stops accepting, while the others ask for more. Its
    # share stays counted until they end.
    ok t_cmp(wait_until(sub { !grep { stat_of($_, 'ClusterSyncOk') != 1 } @s }, 15), 1,
             'before the graceful stop, all syncing');
    my @long = load([$s[2]], 4, 1, 5000, 'drain');
    ok t_cmp(wait_until(sub { (probe_count_in($probes, 'drain'))[0] >= 1 }, 10), 1,
             'the third server runs its long requests');
    @l = load([$s[0], $s[1]], 8, 9, 300, 'drain');
    sleep 0.5;
    kill 'WINCH', $s[2]{pid};
    reap(@l, @long);
    (undef, $max) = probe_count_in($probes, 'drain');
    ok t_cmp($max <= $total ? 1 : 0, 1,
             "a graceful stop under load: never more than $total at once (ran $max)");
    wait_until(sub { !kill 0, $s[2]{pid} }, 20);
    ok t_cmp(join(' ', grep { /:\Q$s[2]{pid}\E\z/ } @{ redis_cmd('HKEYS', "{t$rport:cz}:rows") }),
             '', 'once stopped, its row is gone from Redis (its lease had 2 s to run)');
    $_->{stop}->() for @s[0, 1];
}
else {
    skip('the fleet under load: the event MPM only', 0) for 1 .. $fleet_checks;
}

# A graceful restart that raises the total beyond what the zone's shared
# memory was laid for (64 slots for a total of 6): the zone is laid anew,
# and a server alone runs the whole new total.
my $alone = private_server(member_conf($total, "alone$rport"), cgi_not_cgid => 1);
ok t_cmp(wait_until(sub { zone_stat($alone, 'cz', 'Limit') == $total }, 15), 1,
         "a server alone runs the whole total ($total)");
# the zone's total set to $to in the configuration, and a graceful restart
sub raise_total {
    my ($srv, $to) = @_;
    open my $cf, '<', "$srv->{dir}/httpd.conf" or die;
    my $conf = do { local $/; <$cf> };
    close $cf;
    $conf =~ s/limit=$total /limit=$to /;
    open $cf, '>', "$srv->{dir}/httpd.conf" or die;
    print $cf $conf;
    close $cf;
    kill 'USR1', $srv->{pid};
}
raise_total($alone, 100);
ok t_cmp(wait_until(sub { zone_stat($alone, 'cz', 'Limit') == 100 }, 20), 1,
         'the total raised to 100 by a graceful restart: it runs 100 (runs '
         . zone_stat($alone, 'cz', 'Limit') . ')');
$alone->{stop}->();

# timeout= bounds the whole sync: through a link that delays each answer of
# Redis by 60 ms, a sync that has to connect (connecting, loading the script,
# running it) takes 120 ms in all, over a timeout of 100 ms, though no one
# step does. So the first sync on every connection fails. (A connection that
# a slow machine finished setting up after its sync's time may be kept, and
# a sync on it, one answer, succeeds: that is right, so it is not asserted.)
sub slow_link {
    my ($ms, $conns) = @_;
    my $port = free_port();
    my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port, Listen => 16,
                                  ReuseAddr => 1) or die "listen: $!";
    my $pid = fork // die "fork: $!";
    if ($pid) {
        close $l;
        return ($port, $pid);
    }
    setpgrp(0, 0);
    $SIG{CHLD} = 'IGNORE';
    while (1) {
        my $c = $l->accept or next;
        if (open my $fh, '>>', $conns) { print $fh "1\n"; close $fh }
        my $k = fork // next;
        if ($k) { close $c; next }
        my $r = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $rport)
            or POSIX::_exit(0);
        my $sel = IO::Select->new($c, $r);
        while (my @ready = $sel->can_read) {
            for my $h (@ready) {
                my $n = sysread($h, my $buf, 65536);
                POSIX::_exit(0) unless $n;
                if ($h == $r) { sleep $ms / 1000; syswrite($c, $buf) } else { syswrite($r, $buf) }
            }
        }
        POSIX::_exit(0);
    }
}
sub lines_in { open my $fh, '<', $_[0] or return 0; my @l = <$fh>; return scalar @l }
my $conns = "$work/slow-link-connections";
my ($lport, $lpid) = slow_link(60, $conns);
my $slow = private_server(<<"CONF");
ThrottleCluster slow redis://127.0.0.1:$lport/0 period=300ms timeout=100ms prefix=slow$rport
ThrottleZone sz limit=4 cluster=slow
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
wait_until(sub { zone_stat($slow, 'sz', 'ClusterSyncFailures') >= 5 }, 10);
# each connection counted before its first sync ends: that sync's failure
# is counted within its timeout, so wait for it
my $made = lines_in($conns);
my $failed_each = wait_until(sub { zone_stat($slow, 'sz', 'ClusterSyncFailures') >= $made }, 10);
ok t_cmp($made >= 1 && $failed_each ? 1 : 0, 1,
         'a sync that connects takes 120 ms over a timeout= of 100 ms: it fails, on every '
         . "connection ($made made, " . zone_stat($slow, 'sz', 'ClusterSyncFailures')
         . ' syncs failed)');
ok t_cmp($slow->{log}->(), qr/the sync with Redis failed: .*no answer within timeout= \(100 ms\)/,
         'and the log says the timeout ran out');
$slow->{stop}->();
kill 'TERM', -$lpid;
waitpid $lpid, 0;

# A stop takes the server out of the fleet at once, restarts do not. Two
# servers at a period of 1 s (a lease of 10 s); Redis's MONITOR sees every
# command, those its scripts run included. Graceful and plain restarts of
# the first: nothing deletes its row. Its stop: the row and its expiry go
# before the parent is gone, and the second server runs the whole total
# while the first's lease, read before the stop, would still have run.
sub monitor_start {
    my $c = redis_connect();
    syswrite($c, "MONITOR\r\n");
    sysread($c, my $ok, 5); # +OK\r\n, unbuffered: what follows is sysread
    return { sock => $c, seen => '' };
}
sub monitor_seen {
    my ($m) = @_;
    my $sel = IO::Select->new($m->{sock});
    while ($sel->can_read(0.2)) {
        sysread($m->{sock}, my $buf, 65536) or last;
        $m->{seen} .= $buf;
    }
    return $m->{seen};
}
sub deletes_of {
    my ($m, $id) = @_;
    my $seen = monitor_seen($m);
    return scalar(() = $seen =~ /"(?:HDEL|ZREM)" "[^"]*" "\Q$id\E"/gi);
}
# The leaves of a server, by their own mark: the leave's script takes out
# the row and the expiry, an HDEL then a ZREM naming the id, side by side
# (a script runs whole). A lease run out (no sync for 10 periods on a
# loaded machine) is an HDEL alone, by the next sync's script of any
# server, and the server's own writes its row again.
sub leaves_of {
    my ($m, $id) = @_;
    return scalar(() = monitor_seen($m)
                  =~ /"HDEL" "[^"]*" "\Q$id\E"\r?\n[^\n]*"ZREM" "[^"]*" "\Q$id\E"/gi);
}
# After a failed sync a server settles again (a lease, 10 periods, from
# its next good one) before it raises, so a loaded machine could hold the
# second back: a timeout of half the period, and the wait below.
my @pair = map {
    private_server(member_conf($total, "leave$rport", '1s', '500ms'), cgi_not_cgid => 1)
} 1 .. 2;
my ($first, $second) = @pair;
ok t_cmp(wait_until(sub { !grep { zone_stat($_, 'cz', 'ClusterMembers') != 2 } @pair }, 20), 1,
         'two servers at a period of 1 s see each other');
my ($second_fails, $calm_since) = (zone_stat($second, 'cz', 'ClusterSyncFailures'), time);
my $rows = "{leave$rport:cz}:rows";
my ($id) = grep { /:\Q$first->{pid}\E\z/ } @{ redis_cmd('HKEYS', $rows) };
$id //= 'none';
my $mon = monitor_start();
for my $sig ('USR1', 'HUP') {
    my $old = sync_process_of($first) // 0;
    kill $sig, $first->{pid};
    wait_until(sub { my $p = sync_process_of($first); $p && $p != $old }, 20);
}
ok t_cmp(leaves_of($mon, $id) . ' ' . redis_cmd('HEXISTS', $rows, $id) . ' '
         . scalar(grep { /:\Q$first->{pid}\E\z/ } @{ redis_cmd('HKEYS', $rows) }), '0 1 1',
         "a graceful restart then a restart: the row of $id stays, never taken out by a leave, "
         . 'the only one of its server (its retained state keeps the id)');
# the second settled (a lease and a period since a good sync that no
# failure followed): it raises at its next sync
my $settled = wait_until(sub {
    my $f = zone_stat($second, 'cz', 'ClusterSyncFailures');
    ($second_fails, $calm_since) = ($f, time)
        if $f != $second_fails || zone_stat($second, 'cz', 'ClusterSyncOk') != 1;
    return time - $calm_since >= 11;
}, 60);
my $until = redis_cmd('ZSCORE', "{leave$rport:cz}:leases", $id) // 0;
$first->{stop}->();
ok t_cmp(redis_cmd('HEXISTS', $rows, $id) . ' '
         . (redis_cmd('ZSCORE', "{leave$rport:cz}:leases", $id) // 'none') . ' '
         . leaves_of($mon, $id), '0 none 1',
         'the first stopped: its row and its expiry are gone (one leave: an HDEL, a ZREM)');
$grew = wait_until(sub { zone_stat($second, 'cz', 'Limit') == $total }, 15);
my $at = redis_ms();
ok t_cmp($grew && $at < $until ? 1 : 0, 1, "and the second runs the whole total ($total) "
         . 'before the lease of the first could have ended (' . ($until - $at) . ' ms before; '
         . 'its failed syncs: ' . zone_stat($second, 'cz', 'ClusterSyncFailures')
         . ", $second_fails when the first stopped" . ($settled ? '' : ', unsettled for 60 s')
         . ')');
ok t_cmp($first->{log}->() . $second->{log}->(), qr/^(?!.*could not take its share out)/s,
         'no server says it could not take its share out of Redis');
# A graceful stop (prefork ends it with a signal to its whole process group,
# which the sync process outlives to leave): the row goes too.
my ($second_id) = grep { /:\Q$second->{pid}\E\z/ } @{ redis_cmd('HKEYS', $rows) };
$second_id //= 'none';
kill 'WINCH', $second->{pid};
wait_until(sub { !kill 0, $second->{pid} }, 20);
ok t_cmp(redis_cmd('HEXISTS', $rows, $second_id) . ' ' . leaves_of($mon, $second_id), '0 1',
         "the second stopped gracefully: its row ($second_id) is gone, by one leave");
$second->{stop}->();
close $mon->{sock};

# The sync process: the parent's child holding a connection to Redis.
# Killed three times in a row, another starts each time (from the parent's
# monitor, backing off), and only the first death is logged. Then the
# parent killed with SIGKILL: the sync process ends with it.
sub sync_process_of {
    my ($srv) = @_;
    my $redis = redis_sockets();
    for my $kid (children_of($srv->{pid})) {
        for my $fd (glob "/proc/$kid/fd/*") {
            my $l = readlink($fd) // next;
            return $kid if $l =~ /socket:\[(\d+)\]/ && $redis->{$1};
        }
    }
    return;
}
my $solo = private_server(member_conf($total, "solo$rport"), cgi_not_cgid => 1);
my $sp;
wait_until(sub { $sp = sync_process_of($solo) }, 15);

# What it holds: the standard descriptors (/dev/null), the error log, its
# connection to Redis, closed at an exec (O_CLOEXEC in fdinfo's flags);
# none of the parent's listeners, pipes or lock files.
sub cloexec_of {
    my ($pid, $fd) = @_;
    open my $fh, '<', "/proc/$pid/fdinfo/$fd" or return 0;
    while (<$fh>) {
        return oct($1) & 02000000 ? 1 : 0 if /^flags:\s+([0-7]+)/;
    }
    return 0;
}
my ($connections, $open_on_exec, @other) = (0, 0);
my $redis_inodes = redis_sockets();
for my $fd (glob "/proc/$sp/fd/*") {
    my $to = readlink($fd) // next;
    my ($n) = $fd =~ /(\d+)\z/;
    if ($to =~ /socket:\[(\d+)\]/ && $redis_inodes->{$1}) {
        $connections++;
        $open_on_exec++ unless cloexec_of($sp, $n);
    }
    elsif ($to ne '/dev/null' && $to ne "$solo->{dir}/error_log") {
        push @other, "$n $to";
    }
}
print STDERR "# the sync process ($sp) also holds: ", join(', ', @other), "\n" if @other;
ok t_cmp(join(', ', @other), '', 'the sync process holds nothing of the parent\'s but the '
         . 'standard descriptors and the error log');
ok t_cmp("$connections $open_on_exec", '1 0', 'and one connection to Redis, closed at an exec');
# SIGUSR2 (leave) and SIGTERM from another process than the parent (a CGI
# of the same User could send them): ignored, the process and its row stay.
# Its row written first: on a loaded machine its first sync may fail.
my $solo_id;
wait_until(sub {
    ($solo_id) = grep { /:\Q$solo->{pid}\E\z/ } @{ redis_cmd('HKEYS', "{solo$rport:cz}:rows") };
    defined $solo_id;
}, 15);
$solo_id //= 'none';
my $smon = monitor_start();
kill $_, $sp for 'USR2', 'TERM';
sleep 2;
my $ran_on = kill(0, $sp) && (sync_process_of($solo) // 0) == $sp ? 1 : 0;
ok t_cmp(join(' ', $ran_on, leaves_of($smon, $solo_id),
              redis_cmd('HEXISTS', "{solo$rport:cz}:rows", $solo_id)),
         '1 0 1', 'SIGUSR2 and SIGTERM from another process: the sync process runs on, '
         . 'its server never left')
    or print STDERR "# cluster.t: sync process $sp of row $solo_id alive " . (kill(0, $sp) ? 1 : 0)
        . ', found now ' . (sync_process_of($solo) // 'none') . ', deletes of its row '
        . deletes_of($smon, $solo_id) . ', failed syncs '
        . (zone_stat($solo, 'cz', 'ClusterSyncFailures') // '?') . "\n";
close $smon->{sock};
my $respawned = 0;
for (1 .. 3) {
    my $old = $sp or last;
    kill 'KILL', $old;
    $respawned++ if wait_until(sub { ($sp = sync_process_of($solo)) && $sp != $old }, 30);
}
my $ended = () = $solo->{log}->() =~ /the cluster sync process ended/g;
ok t_cmp("$respawned $ended", '3 1', 'the sync process killed three times in a row: '
         . 'started again each time, the first death logged only');
my @kids = children_of($solo->{pid});
kill 'KILL', $solo->{pid};
ok t_cmp(wait_until(sub { !$sp || !kill 0, $sp }, 10), 1,
         'the parent killed with SIGKILL: its sync process ends too');
kill 'KILL', grep { kill 0, $_ } @kids;

# The parent killed with SIGKILL while CGIs (their headers sent, then
# asleep until the test releases them) run in a cluster zone: the orphaned
# children keep serving, so the sync process closes the zone (a new
# request is refused at once) and keeps the row and its lease in Redis
# for what still runs; once nothing runs it takes the row out and exits.
# One CGI runs in the zone as first laid, the other in the zone laid anew
# by a restart that raised the total: the first ends by its child's death,
# whose record, in the replaced zone, only the sync process gives back.
my $orph = private_server(member_conf($total, "orph$rport"), cgi_not_cgid => 1);
ok t_cmp(wait_until(sub { zone_stat($orph, 'cz', 'Limit') == $total }, 15), 1,
         'a server alone, before its parent is killed, runs the whole total');
my $orows = "{orph$rport:cz}:rows";
my ($oid) = grep { /:\Q$orph->{pid}\E\z/ } @{ redis_cmd('HKEYS', $orows) };
$oid //= 'none';
sub orphan_cgi {
    my ($tag) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        $orph->{get}->("/cgi-bin/probe.cgi?tag=$tag&first=1&release=1&sleep=120000");
        POSIX::_exit(0);
    }
    wait_until(sub { (probe_count_in($probes, $tag))[0] >= 1 }, 15);
    return $pid;
}
my $oa_since = time;
my $oa = orphan_cgi('orphan_a');
# the httpd child running it: the one whose child is a CGI
my ($a_child) = grep { children_of($_) } children_of($orph->{pid});
$a_child //= 0;
raise_total($orph, 100);
ok t_cmp(wait_until(sub { zone_stat($orph, 'cz', 'Limit') == 100 }, 20)
         && $a_child && kill(0, $a_child) ? 1 : 0, 1,
         'the total raised by a graceful restart, the zone laid anew: the first CGI '
         . "still runs (its child $a_child, of the old generation)");
# the CGI's own pid, as it wrote it
my $a_cgi = (map { $_->[1] } probe_order('orphan_a', $probes))[0] // 0;
my $ob = orphan_cgi('orphan_b');
my $osync = sync_process_of($orph);
# the children and theirs (the CGIs), to end them by pid afterwards
my @orphans = children_of($orph->{pid});
push @orphans, map { children_of($_) } @orphans;
my $omon = monitor_start();
kill 'KILL', $orph->{pid};
my $gone_re = qr/\[\S*:warn\].*the server's parent is gone/;
my $said = wait_until(sub { count_in_log($orph, $gone_re) >= 1 }, 15);
sleep 3; # longer than the lease (2 s): only a sync that runs keeps the row
my ($row, $lease) = (redis_cmd('HGET', $orows, $oid) // 'none',
                     redis_cmd('ZSCORE', "{orph$rport:cz}:leases", $oid) // 0);
my $now = redis_ms();
ok t_cmp($said && $row =~ /^\d+ [1-9]\d*$/ && $lease > $now ? 1 : 0, 1,
         'the parent killed while CGIs run: the sync process says so, and a lease past '
         . "its first still holds the row ($row, lease " . ($lease - $now) . ' ms ahead)');
# at once: a 503 after a wait in the queue (timeout=60s) is no close. The
# zone as the children see it, and how long they take to answer at all,
# tell a queue left open from a connection no child accepts.
my $asked = time;
my $closed = join ' ', map { zone_stat($orph, 'cz', $_) } qw(Limit QueueCapacity);
my $status_took = time - $asked;
$asked = time;
my $refused = $orph->{get}->('/cgi-bin/probe.cgi?tag=orphan_new');
my $took = time - $asked;
ok t_cmp($refused->{status} . ($took < 5 ? ' at once' : sprintf(' after %.1f s', $took)),
         '503 at once', 'a new request to the orphaned children is refused at once (their '
         . sprintf('limit and queue: %s, the status page answered in %.1f s)', $closed,
                   $status_took));
probe_release('orphan_b', $probes);
waitpid $ob, 0;
sleep 2; # a lease: the row lapses unless held for the CGI still running
ok t_cmp(redis_cmd('HEXISTS', $orows, $oid) . ' ' . ($osync && kill(0, $osync) ? 1 : 0), '1 1',
         'the second CGI ended, the first runs on: the row is still held (the first CGI '
         . ($a_cgi && kill(0, $a_cgi) ? 'runs' : 'ended') . ' after '
         . sprintf('%.1f s', time - $oa_since) . ', its child '
         . ($a_child && kill(0, $a_child) ? 'lives' : 'is gone') . ')');
kill 'KILL', $a_child if $a_child;
# the leave itself, not the keys' own expiry (10 leases, 20 s)
ok t_cmp(wait_until(sub { !redis_cmd('HEXISTS', $orows, $oid) && !kill(0, $osync // 0) }, 12)
         . ' ' . leaves_of($omon, $oid), '1 1',
         "the first CGI's child killed, the sync process gives back what it held in the "
         . 'replaced zone: the row is taken out (one leave: an HDEL, a ZREM), and it exits');
close $omon->{sock};
ok t_cmp(count_in_log($orph, $gone_re), 1, 'said once, at warning');
probe_release('orphan_a', $probes);
waitpid $oa, 0;
kill 'KILL', grep { kill 0, $_ } @orphans;
