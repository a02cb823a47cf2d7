# A client that disconnects while queued leaves the queue promptly and its
# handler never runs; one that disconnects while running still frees its slot.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

plan tests => 5, need_cgi;

probe_reset('abrt');
my $before = status_auto()->{'Throttle.abrt.Aborted'};
my $hold = bg_get('/abrt/probe.cgi?tag=abrt&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('abrt'))[0] == 1 }) or die 'holder never started';
my $gone = open_request('/abrt/probe.cgi?tag=abrt&id=gone');
wait_until(sub { status_auto()->{'Throttle.abrt.Queued'} == 1 }) or die 'never queued';
close $gone;
# Promptly: while the holder still runs (it runs until released), not
# when its slot would have come free.
my $t0 = time;
my $left = wait_until(sub { status_auto()->{'Throttle.abrt.Queued'} == 0 }, 30);
my $took = time - $t0;
my $running = (probe_count('abrt'))[0];
print STDERR sprintf("# abort.t: queued client left the queue %.0f ms after closing\n",
                     $took * 1000);
ok t_cmp($left && $running == 1 ? 1 : 0, 1,
         sprintf('left the queue while the holder still ran (after %.0f ms; running %d)',
                 $took * 1000, $running));
ok t_cmp(status_auto()->{'Throttle.abrt.Aborted'} - $before, 1, 'counted as aborted');
probe_release('abrt');
bg_wait($hold);
ok t_cmp(scalar(grep { $_->[0] eq 'gone' } probe_order('abrt')), 0,
         'its handler never ran');

# Disconnect while running: the slot is released when the handler ends.
my $run = open_request('/abrt/probe.cgi?tag=abrt&sleep=500&id=run');
wait_until(sub { (probe_count('abrt'))[0] == 1 }) or die 'never ran';
close $run;
ok t_cmp(wait_until(sub { status_auto()->{'Throttle.abrt.Active'} == 0 }, 5), 1,
         'slot released after a client left mid-request');
ok t_cmp(http_get('/abrt/probe.cgi?tag=abrt&id=next')->{status}, 200, 'zone usable');
