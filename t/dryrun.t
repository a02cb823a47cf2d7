# dry_run=on: decisions are made and counted, but under overload no request
# is delayed or refused; THROTTLE_RESULT says dry-run where the zone would
# have queued or rejected.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(sleep);

plan tests => 8, need_cgi;

my $log_file = Apache::Test::vars('t_logs') . '/throttle_log';
my $log_start = -s $log_file || 0;
my $a0 = status_auto();

probe_reset('dry');
my @r = parallel_get(map { "/dry/probe.cgi?tag=dry&sleep=600&id=d$_" } 1 .. 6);
my $a1 = status_auto();

ok t_cmp(scalar(grep { $_->{status} == 503 } @r), 0, 'no 503 under overload');
ok t_cmp(scalar(grep { $_->{status} == 200 } @r), 6, 'all 6 ran');
ok t_cmp((probe_count('dry'))[1] > 1, 1, 'more than the limit ran at once (nothing was held back)');
# nobody waits in a dry run: a queued request would have waited for a CGI
# of 600 ms to end
my $dry = grep { $_->{body} =~ /result=dry-run wait_us=(\d+) / && $1 < 600000 } @r;
ok t_cmp($dry >= 2, 1, "THROTTLE_RESULT=dry-run for those over the limit ($dry)");
my $counted = ($a1->{'Throttle.dry.DryRunQueued'} - $a0->{'Throttle.dry.DryRunQueued'})
            + ($a1->{'Throttle.dry.DryRunRejected'} - $a0->{'Throttle.dry.DryRunRejected'});
ok t_cmp($counted, $dry, 'dry-run counters agree with what the requests saw');
ok t_cmp("$a1->{'Throttle.dry.OverCap'} $a1->{'Throttle.dry.Active'}", '0 0',
         'nothing left over the cap or active');

sleep 0.2;
open my $log, '<', $log_file or die;
seek $log, $log_start, 0;
my @lines = grep { m{"GET /dry/probe} } <$log>;
ok t_cmp(scalar(grep { /\s200 dry dry-run \d+$/ } @lines), $dry,
         'the log variable says dry-run');

open my $elog, '<', Apache::Test::vars('t_logs') . '/error_log' or die;
my $decisions = grep { /zone dry: dry-run \(would have (queued|been rejected: queue full)\), priority 0, waited \d+ us, \d+ waiting ahead/ } <$elog>;
ok t_cmp($decisions >= $dry, 1, "LogLevel adaptive_throttle:debug logs each dry-run decision ($decisions)");
