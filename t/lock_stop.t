# A child stopped (SIGSTOP, as a debugger or a frozen cgroup does) while it
# holds a zone's lock holds no other request past its deadline: requests
# of the zone are refused once their timeout has passed, with Retry-After;
# the status page answers without the lock and marks the zone stale; other
# requests are served as ever. When the holder is gone, the zone serves.
#
# The lock is taken by the test module's fault hook
# (MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER): the first throttled request
# takes it and hangs; the test then stops that process.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use POSIX ();
use Time::HiRes qw(time);

plan tests => 6, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $spool = tempdir(CLEANUP => 1);
chmod 0777, $spool;
my $holder_file = "$spool/holder.pid";
local $ENV{MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER} = $holder_file;
my $srv = private_server(<<'CONF', ready => '/ts?auto');
ThrottleZone lk limit=2 queue=5 timeout=1s
<Location /zoned.txt>
    Throttle lk
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
open my $fh, '>', "$srv->{dir}/zoned.txt" or die;
print $fh "zoned\n";
close $fh;
chmod 0644, "$srv->{dir}/zoned.txt";

# (status, seconds, Retry-After) of a request, or status 0 after $secs.
sub timed_get {
    my ($path, $secs) = @_;
    my ($r, $t0) = ({status => 0}, time);
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm $secs;
        $r = $srv->{get}->($path);
        alarm 0;
    };
    alarm 0;
    my ($retry) = ($r->{raw} // '') =~ /^Retry-After: (\d+)/mi;
    return ($r->{status}, time - $t0, $retry, $r->{body} // '');
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

# Three requests of the zone at once: each refused once its 1 s has
# passed, not held on (the holder stays stopped as long as the test lasts;
# a request held on would reach the client's 60 s limit).
my @kids = map { bg_get('/zoned.txt', port => $srv->{port}) } 1 .. 3;
my @r = map { bg_wait($_) } @kids;
my @late = grep { $_->{status} != 503 || $_->{secs} < 1 || $_->{secs} > 1 + 10 } @r;
print STDERR sprintf("# lock_stop.t: zone requests answered %s in %s s\n",
                     join(' ', map { $_->{status} } @r),
                     join(' ', map { sprintf '%.2f', $_->{secs} } @r));
ok t_cmp(scalar(@late), 0, 'requests of the zone are refused after their timeout, within 10 s more');
ok t_cmp(scalar(grep { ($_->{headers}{'retry-after'} // '') =~ /^\d+$/ } @r), 3,
         'with Retry-After');

# The page waits for the lock a bounded while (0.2 s) and then reads what
# it can without it; one that waited for the lock would not answer at all.
my ($st, $took, undef, $body) = timed_get('/ts?auto', 20);
my ($stale) = $body =~ /^Throttle\.lk\.Stale: (\d+)$/m;
my ($locked) = $body =~ /^Throttle\.lk\.RejectedLocked: (\d+)$/m;
ok t_cmp($st == 200 ? "answered, stale $stale" : "status $st after $took s",
         'answered, stale 1', sprintf('the status page answers (%.2f s), the zone marked stale', $took));
ok t_cmp(($locked // 0) >= 3, 1, 'RejectedLocked counts the refusals');
my ($st2) = timed_get('/hello.txt', 5);
ok t_cmp($st2, 200, 'requests outside the zone are served meanwhile');

# The holder dies: the lock is repaired and the zone serves again.
kill 'KILL', $holder;
my $ok = wait_until(sub { (timed_get('/zoned.txt', 5))[0] == 200 }, 10);
ok t_cmp($ok, 1, 'once the holder is gone, the zone serves again');
waitpid($hanger, 0);
$srv->{stop}->();
