# Waiters are admitted in the order they arrived.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 3, need_cgi;

probe_reset('fifo');
# Held until all 8 are queued, however slow the machine (60 s at most).
my $hold = bg_get('/fifo/probe.cgi?tag=fifo&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('fifo'))[0] == 1 }) or die 'holder never started';
my @pids;
for my $i (1 .. 8) {
    push @pids, bg_get("/fifo/probe.cgi?tag=fifo&sleep=50&id=w$i");
    # enqueue one at a time, so arrival order is known
    wait_until(sub { (status_auto()->{'Throttle.fifo.Queued'} // -1) == $i })
        or die "waiter $i never queued";
}
probe_release('fifo');
my @r = map { bg_wait($_) } $hold, @pids;
ok t_cmp(scalar(grep { $_->{status} == 200 } @r), 9, 'all admitted');
my $order = join ' ', map { $_->[0] } probe_order('fifo');
ok t_cmp($order, 'hold w1 w2 w3 w4 w5 w6 w7 w8', 'started in arrival order');
ok t_cmp((probe_count('fifo'))[1], 1, 'one at a time');
