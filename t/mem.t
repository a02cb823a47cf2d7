# mem= in a real server: requests of a zone start only while the memory
# reading has room for them, whatever the limit says.
#
# The reading comes from a cgroup v2 laid out by t/run-apache-tests (1 GiB;
# MOD_ADAPTIVE_THROTTLE_TEST_MEM_ROOT), whose memory.current this test and
# the CGIs rewrite: probe.cgi?mem=200 adds 200 MiB while it runs, as a
# request that takes that much would.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Fcntl qw(:flock);
use Time::HiRes qw(time sleep);

plan tests => 11, need need_cgi(),
    { 'run by t/run-apache-tests (needs its memory cgroup layout)' => $ENV{MEM_CURRENT} };

my $MiB = 1048576;

# What the rest of the machine uses in the cgroup, in MiB.
sub set_used {
    my ($mib) = @_;
    my $file = $ENV{MEM_CURRENT};
    open(my $lk, '>>', "$file.lock") or die "$file.lock: $!";
    flock($lk, LOCK_EX) or die;
    open(my $out, '>', "$file.t") or die;
    print $out $mib * $MiB, "\n";
    close $out;
    rename("$file.t", $file) or die;
    chmod 0666, $file;
    close $lk;
}

sub used_mib {
    open(my $in, '<', $ENV{MEM_CURRENT}) or die;
    return <$in> / $MiB;
}

# 824 MiB free: room for 4 requests of 200 MiB, though the limit is 8.
set_used(200);
probe_reset('mem');
my @r = parallel_get(map { "/memz/probe.cgi?tag=mem&id=m$_&sleep=1500&mem=200" } 1 .. 8);
ok t_cmp(join(' ', map { $_->{status} } @r), join(' ', ('200') x 8), 'all 8 answered');
my (undef, $max) = probe_count('mem');
ok t_cmp($max, 4, 'the CGIs saw 4 running at once: what memory allows, not the limit of 8');
my $s = status_auto();
ok t_cmp($s->{'Throttle.memz.HeldForMemory'} >= 1, 1,
         "held for memory with slots free ($s->{'Throttle.memz.HeldForMemory'})");
ok t_cmp("$s->{'Throttle.memz.Mem'} $s->{'Throttle.memz.MemSource'}", 200 * $MiB . ' cgroup2',
         'status: mem= in bytes, read from cgroup v2');
ok t_cmp(used_mib(), 200, 'the CGIs gave their memory back');

# Memory taken by something else: a request waits, with every slot free,
# until it is given back.
set_used(900);
sleep 0.3; # while there was room, the zone trusts a reading up to 250 ms old
probe_reset('mem2');
my $t0 = time;
my $pid = bg_get('/memz/probe.cgi?tag=mem2&id=late&mem=200');
wait_until(sub { status_auto()->{'Throttle.memz.Queued'} == 1 }, 10);
sleep 0.5;
$s = status_auto();
ok t_cmp("$s->{'Throttle.memz.Active'} $s->{'Throttle.memz.Queued'}", '0 1',
         'with 124 MiB free, nothing runs and the request waits');
ok t_cmp(($s->{'Throttle.memz.MemAvailable'} // 0) / $MiB, 124, 'status: the reading (MiB)');
set_used(200);
my $late = bg_wait($pid);
my $took = time - $t0;
ok t_cmp($late->{status} == 200 && $late->{body} =~ /result=queued/, 1,
         'it runs once memory is back (THROTTLE_RESULT=queued)');
ok t_cmp($took >= 0.5 && $took < 5, 1, sprintf('after %.2f s', $took));

# Held for memory past the timeout: 503 with Retry-After.
set_used(900);
sleep 0.3;
my $r = http_get('/memt/probe.cgi?tag=mem3');
ok t_cmp("$r->{status} " . (defined $r->{headers}{'retry-after'} ? 'retry-after' : 'none'),
         '503 retry-after', 'timed out waiting for memory: 503 with Retry-After');
ok t_cmp($r->{secs} >= 0.9, 1, sprintf('after the 1 s timeout (%.2f s)', $r->{secs}));
set_used(200);
