# Waiters sleep until a reason: a queued client that disconnects is still
# noticed (it leaves the queue, counted as aborted, its handler never runs),
# and a released slot still goes to the next waiter at once, not when a
# waiter happens to wake. Bounds are generous, far below the zone's 90 s
# timeout, which is when a waiter nobody woke would look again.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time);

plan tests => 6, need_cgi;

my $N = 8;
probe_reset('idlew');
my $st = status_auto();
my ($aborted0, $admitted0) = ($st->{'Throttle.idlew.Aborted'}, $st->{'Throttle.idlew.Admitted'});
my $hold = bg_get('/idlew/probe.cgi?tag=idlew&sleep=120000&release=1&id=hold');
wait_until(sub { (probe_count('idlew'))[0] == 1 }) or die 'holder never started';
my @q;
for my $i (1 .. $N) {
    push @q, open_request("/idlew/probe.cgi?tag=idlew&sleep=50&id=w$i");
    wait_until(sub { status_auto()->{'Throttle.idlew.Queued'} == $i }) or die "w$i never queued";
}

# Half of them go away: each is noticed, while the holder still runs.
close $_ for @q[0 .. $N / 2 - 1];
my $t0 = time;
my $left = wait_until(sub { status_auto()->{'Throttle.idlew.Queued'} == $N / 2 }, 20);
my $took = time - $t0;
print STDERR sprintf("# idle_wait.t: %d disconnected waiters left the queue in %.0f ms\n",
                     $N / 2, $took * 1000);
ok t_cmp($left ? 1 : 0, 1,
         sprintf('the disconnected waiters left the queue (after %.1f s; queued %d)',
                 $took, status_auto()->{'Throttle.idlew.Queued'}));
ok t_cmp(status_auto()->{'Throttle.idlew.Aborted'} - $aborted0, $N / 2, 'counted as aborted');
ok t_cmp((probe_count('idlew'))[0], 1, 'the holder still runs, alone');

# The slot is handed down the queue: every waiter left runs, one after
# the other, each woken by the hand-off.
$t0 = time;
probe_release('idlew');
bg_wait($hold);
my $served = 0;
for my $s (@q[$N / 2 .. $N - 1]) {
    my $answer = join '', <$s>;
    $served++ if $answer =~ m{^HTTP/1\.\d 200};
    close $s;
}
$took = time - $t0;
print STDERR sprintf("# idle_wait.t: %d hand-offs in %.0f ms\n", $N / 2, $took * 1000);
ok t_cmp($served, $N / 2, 'every waiter left was served');
ok t_cmp($took < 30 ? 1 : 0, 1,
         sprintf('each was woken by its hand-off (all served in %.1f s, timeout 90 s)', $took));
my %ran = map { $_->[0] => 1 } probe_order('idlew');
ok t_cmp(scalar(grep { $ran{"w$_"} } 1 .. $N / 2), 0, 'no disconnected waiter ran');
