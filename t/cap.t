# The cap holds when many more clients than the limit arrive at once, as
# witnessed by the running CGIs themselves; the waiting ones are queued,
# not refused, and the outcome reaches the CGI environment.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 6, need_cgi;

probe_reset('cap');
my @r = parallel_get(map { "/cap/probe.cgi?tag=cap&sleep=300&id=c$_" } 1 .. 12);
my ($cur, $max) = probe_count('cap');

ok t_cmp(scalar(grep { $_->{status} == 200 } @r), 12, 'all 12 answered 200');
ok t_cmp($max, 2, 'at most (and at some point exactly) 2 ran at once');
ok t_cmp($cur, 0, 'none left running');
my @queued = grep { $_->{body} =~ /result=queued wait_us=(\d+)/ && $1 > 0 } @r;
ok t_cmp(scalar(@queued) >= 6, 1, 'most waited in the queue with a wait time');
ok t_cmp(scalar(grep { $_->{body} =~ /zone=cap result=(admitted|queued)/ } @r), 12,
         'THROTTLE_ZONE and THROTTLE_RESULT reach the CGI');
my $s = status_auto();
ok t_cmp("$s->{'Throttle.cap.Active'}/$s->{'Throttle.cap.Queued'}", '0/0', 'zone counts back to 0');
