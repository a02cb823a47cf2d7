# Zone state survives a graceful restart (the old generation's running
# request still holds its slot, so the new generation cannot exceed the cap),
# and the cap holds under load across repeated graceful restarts.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time sleep);

plan tests => 6, need_cgi;

sub graceful {
    my $before = restarts_seen();
    kill 'USR1', server_pid() or die "cannot signal the server: $!";
    wait_until(sub { restarts_seen() > $before }, 20) or die 'graceful restart did not finish';
    sleep 0.3; # new children take their places
}

probe_reset('grace');
# It runs across the restart, until the test releases it.
my $hold = bg_get('/grace/probe.cgi?tag=grace&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('grace'))[0] == 1 }) or die 'holder never started';
graceful();
my $r = http_get('/grace/probe.cgi?tag=grace&id=after');
ok t_cmp($r->{status}, 503, 'after graceful, the old generation still holds the slot');
ok t_cmp(status_auto()->{'Throttle.grace.Active'}, 1, 'active count kept');
probe_release('grace');
ok t_cmp(bg_wait($hold)->{status}, 200, 'the request running across the restart finished');
ok t_cmp(http_get('/grace/probe.cgi?tag=grace&id=later')->{status}, 200,
         'its slot came back to the new generation');

# Load across three graceful restarts.
probe_reset('storm');
my $pid = fork // die;
if (!$pid) {
    sleep 0.8;
    for (1 .. 3) { graceful(); sleep 0.5 }
    require POSIX;
    POSIX::_exit(0);
}
my @st = load_loop_ids('/storm/probe.cgi?tag=storm&sleep=100', 8, 5);
waitpid($pid, 0);
my %answered = map { $_->[0] => 1 } grep { $_->[1] == 200 } @st;
ok t_cmp(probe_overlap_of('storm', \%answered), 2,
         'the CGIs of answered requests never ran more than the limit of 2 at once');
my @bad = grep { $_->[1] != 200 && $_->[1] != 503 } @st;
ok t_cmp(scalar(@bad), 0, scalar(@st) . ' requests, none failed but by 503');
