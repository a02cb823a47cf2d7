# cluster=: three private httpds share one zone's limit through a private
# redis-server. The CGIs count themselves in one directory for the whole
# fleet, so the count is the fleet's, measured from outside the module: it
# never exceeds the total while Redis answers; load on one server only
# moves nearly all the total there; with Redis stopped each server runs
# its cluster_fallback=; with Redis back the shares come back. Bad
# configurations fail at configtest.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use POSIX ();
use Time::HiRes qw(time sleep);

my $redis = (grep { -x } map { "$_/redis-server" } split(/:/, $ENV{PATH}), '/usr/bin')[0];
plan tests => 18, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
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

# ---- three servers, one cluster zone of 6 ----
my $total = 6;
my $probes = "$work/probes";
mkdir $probes;
chmod 0777, $probes;
sub member {
    # mod_cgi: mod_cgid's daemon restarts with a graceful restart, and the
    # requests of that moment would fail rather than run
    return private_server(cgi_conf($probes) . <<"CONF", cgi_not_cgid => 1);
ThrottleCluster fleet redis://127.0.0.1:$rport/0 period=200ms timeout=50ms prefix=t$rport
ThrottleZone cz limit=$total queue=100 timeout=60s cluster=fleet cluster_fallback=1
<Location /cgi-bin/>
    Throttle cz
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
}
my @s = map { member() } 1 .. 3;

sub stat_of { zone_stat($_[0], 'cz', $_[1]) }

ok t_cmp(wait_until(sub { !grep { stat_of($_, 'ClusterMembers') != 3 } @s }, 20), 1,
         'each server sees the three members: '
         . join(' ', map { stat_of($_, 'ClusterMembers') } @s));

# Clients on $srv for $secs: each asks for a probe that sleeps $ms.
sub load {
    my ($srvs, $clients, $secs, $ms) = @_;
    my @pids;
    for my $srv (@$srvs) {
        for my $c (1 .. $clients) {
            my $pid = fork // die "fork: $!";
            if (!$pid) {
                my $end = time + $secs;
                $srv->{get}->("/cgi-bin/probe.cgi?tag=fleet&sleep=$ms") while time < $end;
                POSIX::_exit(0);
            }
            push @pids, $pid;
        }
    }
    return @pids;
}
sub reap { waitpid $_, 0 for @_ }

# Load on one server only: its share grows to nearly all of the total.
my @l = load([$s[0]], 10, 8, 200);
my $grew = wait_until(sub { stat_of($s[0], 'Limit') >= $total - 2 }, 15);
ok t_cmp($grew, 1, 'load on one server only: its share grows to the total less the '
         . 'floors: limits ' . join(' ', map { stat_of($_, 'Limit') } @s));
reap(@l);
my (undef, $max) = probe_count_in($probes, 'fleet');
ok t_cmp($max <= $total ? 1 : 0, 1, "the fleet never ran more than $total at once (ran $max)");
# The cap checks above and below would pass if nothing ran: something did,
# more than the one request a server's floor lets it start.
ok t_cmp($max >= 3 ? 1 : 0, 1, "the loaded server ran several at once ($max): not all refused");

# Load on all three: still never more than the total.
@l = load(\@s, 5, 6, 100);
reap(@l);
(undef, $max) = probe_count_in($probes, 'fleet');
ok t_cmp($max <= $total ? 1 : 0, 1,
         "load on every server: never more than $total at once (ran $max)");
my $sum = 0;
$sum += stat_of($_, 'ClusterShare') for @s;
ok t_cmp($sum <= $total ? 1 : 0, 1, "the shares Redis holds sum to $total at most ($sum)");

# A graceful restart of one server under load: it keeps its share and its
# name in Redis (the parent's pid), and the fleet stays within the total.
@l = load(\@s, 4, 5, 100);
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

# Redis back (empty): the shares come back, and follow the load again.
redis_start();
ok t_cmp(wait_until(sub { !grep { stat_of($_, 'ClusterFallback') != 0 } @s }, 15), 1,
         'Redis back: no server runs its fallback');
@l = load([$s[1]], 10, 8, 200);
ok t_cmp(wait_until(sub { stat_of($s[1], 'Limit') >= $total - 2 }, 15), 1,
         'Redis back: the shares follow the load again: limits '
         . join(' ', map { stat_of($_, 'Limit') } @s));
reap(@l);
(undef, $max) = probe_count_in($probes, 'fleet');
ok t_cmp($max <= $total ? 1 : 0, 1, "in all, never more than $total at once (ran $max)");
$_->{stop}->() for @s;
