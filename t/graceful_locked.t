# A graceful restart while a stopped child holds a zone's lock: the parent
# must not wait for that lock. The restart completes while the holder
# stays stopped, other requests are served meanwhile, and the new definition
# of the zone (limit 2 -> 3) applies as soon as the lock is free again.
#
# The lock is taken by the test module's fault hook
# (MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER): the first throttled request
# takes it and hangs; the test then stops that process with SIGSTOP.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use POSIX ();
use Time::HiRes qw(time sleep);

plan tests => 4, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $spool = tempdir(CLEANUP => 1);
chmod 0777, $spool;
my $holder_file = "$spool/holder.pid";
local $ENV{MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER} = $holder_file;
my $srv = private_server(<<'CONF', ready => '/ts?auto');
ThrottleZone lk limit=2 queue=5 timeout=10s
<Location /zoned.txt>
    Throttle lk
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
for my $f ('zoned.txt') {
    open my $fh, '>', "$srv->{dir}/$f" or die;
    print $fh "zoned\n";
    close $fh;
    chmod 0644, "$srv->{dir}/$f";
}
sub resumed { scalar(() = $srv->{log}->() =~ /resuming normal operations/g) }

# A request that may hang (a parent stuck in its restart accepts nothing):
# its status, or 0 after $secs.
sub status_within {
    my ($path, $secs) = @_;
    my $st = 0;
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm $secs;
        $st = $srv->{get}->($path)->{status};
        alarm 0;
    };
    alarm 0;
    return $st;
}

my $hanger = fork // die;
if (!$hanger) {
    $srv->{get}->('/zoned.txt');
    POSIX::_exit(0);
}
wait_until(sub { -s $holder_file }, 10) or die 'the hook never fired';
my $holder = do { local (@ARGV, $/) = ($holder_file); <> };
$holder =~ s/\s+//g;
stop_process($holder);

# A new definition, and a graceful restart.
my $conf = do { local (@ARGV, $/) = ("$srv->{dir}/httpd.conf"); <> };
$conf =~ s/limit=2 queue=5/limit=3 queue=5/ or die;
open my $out, '>', "$srv->{dir}/httpd.conf" or die;
print $out $conf;
close $out;
my $before = resumed();
my $t0 = time;
kill 'USR1', $srv->{pid};
# The holder stays stopped until the test kills it below: a parent that
# waited for its lock would never finish.
my $done = wait_until(sub { resumed() > $before }, 30);
my $took = time - $t0;
print STDERR sprintf("# graceful_locked.t: restart done after %.2f s with the lock held "
                     . "by stopped process %d\n", $took, $holder);
ok t_cmp($done, 1, sprintf('the graceful restart completed with the holder stopped (%.2f s)', $took));
ok t_cmp(status_within('/hello.txt', 5), 200, 'other requests are served meanwhile');

# The lock comes free: the new limit is in force.
kill 'KILL', $holder;
my $limit;
wait_until(sub {
    my $body = eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm 5;
        my $b = $srv->{get}->('/ts?auto')->{body};
        alarm 0;
        $b;
    } // '';
    alarm 0;
    ($limit) = $body =~ /^Throttle\.lk\.Limit: (\d+)$/m;
    ($limit // 0) == 3 }, 5);
ok t_cmp($limit, 3, 'the new limit applies once the lock is free');
ok t_cmp(status_within('/zoned.txt', 5), 200, 'the zone serves again');
waitpid($hanger, 0);
$srv->{stop}->();
