# A process SIGKILLed while it holds a zone's shared lock: the next request
# to take the lock finds it abandoned, rebuilds the zone from its records
# and goes on; requests that were blocked on the lock go on too.
#
# The window is widened by a fault-injection hook armed from the server's
# environment (MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER): the first throttled
# request takes the lock, writes its pid to the named file and hangs.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use POSIX ();
use Time::HiRes qw(time sleep);

plan tests => 6, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $spool = tempdir(CLEANUP => 1);
chmod 0777, $spool; # the children run as nobody
my $holder_file = "$spool/holder.pid";
local $ENV{MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER} = $holder_file;
my $srv = private_server(<<'CONF',
ThrottleZone lk limit=2 queue=5 timeout=10s
<Location /hello.txt>
    Throttle lk
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
    ready => '/ts?auto');
my $mpm = $ENV{MPM} // 'prefork';

# A request from a child process, whose exit code says how it ended:
# 0 answered 200, 2 connection lost (its server process died), 1 anything else.
sub bg {
    my ($path) = @_;
    my $pid = fork // die;
    if (!$pid) {
        my $st = $srv->{get}->($path)->{status};
        POSIX::_exit($st == 200 ? 0 : $st == 0 ? 2 : 1);
    }
    return $pid;
}

sub zone_status {
    return { map { /^([^:]+):\s*(.*)$/ ? ($1, $2) : () }
             split /\n/, $srv->{get}->('/ts?auto')->{body} };
}

my $hanger = bg('/hello.txt');
wait_until(sub { -s $holder_file }, 10) or die 'the hook never fired';
my $victim = do { local (@ARGV, $/) = ($holder_file); <> };
$victim =~ s/\s+//g;
ok t_cmp($victim != $srv->{pid} && $victim > 0, 1, "lock held by child $victim");

# With the lock held, another request to the zone cannot get past it.
my $blocked = bg('/hello.txt');
sleep 1;
ok t_cmp(waitpid($blocked, POSIX::WNOHANG()) == 0, 1, 'a second request blocks on the lock');

# Usable again: a request answered 200 before the zone's 10 s timeout has
# passed since the kill; without the repair each would wait that long for
# the lock and be refused.
kill 'KILL', $victim;
my $t0 = time;
my $r;
while (time - $t0 < 20) {
    $r = $srv->{get}->('/hello.txt');
    last if $r->{status} == 200;
    sleep 0.05;
}
my $took = time - $t0;
print STDERR sprintf("# lock_kill.t: zone usable %.3f s after its lock holder was killed\n", $took);
ok t_cmp($r->{status} == 200 && $took < 10, 1,
         sprintf('zone usable again after %.3f s, within its timeout', $took));

waitpid($blocked, 0);
my $how = $? >> 8;
# Under worker and event the blocked request may have been a thread of the
# killed process itself (its connection lost); under prefork it was another
# child and must be answered. An error answer fails either way.
ok t_cmp($how == 0 || ($how == 2 && $mpm ne 'prefork'), 1,
         "the blocked request went on ($mpm: " . (qw(answered error lost))[$how] . ')');
waitpid($hanger, 0);

ok t_cmp(zone_status()->{'Throttle.lk.LockRepairs'}, 1, 'one lock repair counted');
my $s;
wait_until(sub { $s = zone_status();
                 $s->{'Throttle.lk.Active'} == 0 && $s->{'Throttle.lk.Queued'} == 0 }, 5);
ok t_cmp("$s->{'Throttle.lk.Active'} $s->{'Throttle.lk.Queued'}", '0 0',
         'nothing left held or queued');
$srv->{stop}->();
