# ThrottlePriority, reserve= and codel=: who waits first, the slots kept
# for higher priorities, and how long a standing queue may hold a request.
# The CGIs record the order they started in and how many ran at once.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use JSON::PP;
use lib 't/lib';
use ThrottleT;

plan tests => 15, need_cgi;

# GET $late while a request on $holder (tag $tag) holds the zone's only slot
# until the late one is answered (30 s at most); returns its result.
sub behind_holder {
    my ($holder, $tag, $late) = @_;
    probe_reset($tag);
    my $hold = bg_get("${holder}probe.cgi?tag=$tag&sleep=30000&release=1&id=hold");
    wait_until(sub { (probe_count($tag))[0] == 1 }) or die 'holder never started';
    my $r = http_get("${late}probe.cgi?tag=$tag&id=late");
    probe_release($tag);
    bg_wait($hold);
    return $r;
}

# ---- order: priority first, then arrival ----
probe_reset('prio');
# the holder holds until every waiter is queued, however slow the machine
my $hold = bg_get('/prio/probe.cgi?tag=prio&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('prio'))[0] == 1 }) or die 'holder never started';
my @waiters = (['lo1', '/prio-lo/'], ['w1', '/prio/'], ['hi1', '/prio-hi/'],
               ['w2', '/prio/'], ['vip', '/prio/', '&vip=1'], ['lo2', '/prio-lo/'],
               ['hi2', '/prio-hi/']);
my @pids;
for my $i (0 .. $#waiters) {
    my ($id, $path, $extra) = @{ $waiters[$i] };
    push @pids, bg_get("${path}probe.cgi?tag=prio&sleep=50&id=$id" . ($extra // ''));
    # one at a time, so that arrival order is known
    wait_until(sub { (status_auto()->{'Throttle.prio.Queued'} // -1) == $i + 1 })
        or die "waiter $id never queued";
}
probe_release('prio');
my @r = map { bg_wait($_) } $hold, @pids;
ok t_cmp(scalar(grep { $_->{status} == 200 } @r), 8, 'all admitted');
my $order = join ' ', map { $_->[0] } probe_order('prio');
ok t_cmp($order, 'hold vip hi1 hi2 w1 w2 lo1 lo2',
         'started by priority (an <If> raised vip to 8), then in arrival order');
ok t_cmp((probe_count('prio'))[1], 1, 'one at a time');
my %prio_of = map { ($_->{body} =~ /id=(\w+)/)[0] => ($_->{body} =~ /priority=(-?\d+)/)[0] } @r;
ok t_cmp(join(' ', map { "$_=$prio_of{$_}" } qw(hold vip hi1 lo1)), 'hold=0 vip=8 hi1=5 lo1=-2',
         'THROTTLE_PRIORITY in the CGI environment');
my $s = status_auto();
ok t_cmp(join(' ', map { $s->{"Throttle.prio.Priority.$_.Admitted"} // '-' } 8, 5, 0, -2),
         '1 2 3 2', 'admitted counted per priority on the status page');

# ---- a priority's own timeout ----
my $q = behind_holder('/prio/', 'prioq', '/prio-quick/');
ok t_cmp($q->{status} == 503 && $q->{secs} < 15, 1,
         "priority 1 timeout=300ms: 503 after $q->{secs} s, not the zone's 30 s");
ok t_cmp(status_auto()->{'Throttle.prio.Priority.1.Rejected'}, 1, 'counted as refused at priority 1');

# ---- reserve=1 on limit=2: priority 0 never fills the last slot ----
probe_reset('resv');
probe_reset('resvhi');
my @low = map { bg_get("/resv/probe.cgi?tag=resv&sleep=300&id=l$_") } 1 .. 8;
wait_until(sub { (status_auto()->{'Throttle.resv.Queued'} // 0) >= 4 })
    or die 'the low-priority clients never queued';
my $hi = http_get('/resv-hi/probe.cgi?tag=resvhi&id=hi');
my @lr = map { bg_wait($_) } @low;
ok t_cmp(scalar(grep { $_->{status} == 200 } @lr), 8, '8 low-priority clients all served');
ok t_cmp((probe_count('resv'))[1], 1, 'never more than limit - reserve of them at once');
ok t_cmp($hi->{body} =~ /result=admitted /, 1,
         'a priority 1 request behind them ran at once on the reserved slot');

# ---- codel=200ms:500ms: a standing queue cuts waits to 200 ms ----
my $c = behind_holder('/cdl/', 'cdl', '/cdl/');
ok t_cmp($c->{status} == 503 && $c->{secs} < 15, 1,
         "a waiter in a queue that stood: 503 after $c->{secs} s, not the 20 s timeout");
$s = status_auto();
ok t_cmp(join(' ', map { $s->{"Throttle.cdl.$_"} // '-' } qw(RejectedStanding RejectedTimeout
         CodelTargetMs QueueStanding)), '1 0 200 0', 'counted as rejected-standing');

# ---- the other formats ----
my $prom = http_get('/throttle-status?prometheus')->{body};
ok t_cmp($prom =~ /^apache_throttle_priority_admitted_total\{zone="prio",priority="5"\} 2$/m
         && $prom =~ /^apache_throttle_rejected_total\{zone="cdl",reason="standing"\} 1$/m
         && $prom =~ /^apache_throttle_priority_wait_seconds\{zone="prio",priority="8",quantile="0.99"\} [\d.]+$/m,
         1, 'Prometheus: priority label, standing reason, wait quantiles');
my $json = decode_json(http_get('/throttle-status?json')->{body});
my ($pz) = grep { $_->{name} eq 'prio' } @{ $json->{zones} };
my %jp = map { $_->{priority} => $_ } @{ $pz->{priorities} };
ok t_cmp(join(' ', map { $jp{$_}{admitted} // '-' } 8, 5, 1, 0, -2), '1 2 0 4 2',
         'JSON: priorities (the timeout test added one at 0 and one refused at 1)');
ok t_cmp($pz->{reserve} . ' ' . (grep({ $_->{name} eq 'resv' } @{ $json->{zones} }))[0]{reserve},
         '0 1', 'JSON: reserve');
