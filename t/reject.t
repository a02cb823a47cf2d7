# A full queue answers 503 at once and a wait past the timeout answers 503,
# both with Retry-After, through ErrorDocument 503, and logged.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(sleep);

plan tests => 11, need_cgi;

my $log_file = Apache::Test::vars('t_logs') . '/throttle_log';
my $log_start = -s $log_file || 0;

# limit 1, queue 1: one runs, one waits, three are turned away at once. The
# holder runs until the three have their answers, however slow the machine.
probe_reset('small');
my $hold = bg_get('/small/probe.cgi?tag=small&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('small'))[0] == 1 }) or die 'holder never started';
my @pids = map { bg_get("/small/probe.cgi?tag=small&sleep=100&id=r$_") } 1 .. 4;
my $early = wait_until(sub { (grep { bg_done($_) } @pids) >= 3 }, 30);
probe_release('small');
my @r = map { bg_wait($_) } @pids;
my $held = bg_wait($hold);
my @ok = grep { $_->{status} == 200 } @r;
my @busy = grep { $_->{status} == 503 } @r;
ok t_cmp($held->{status}, 200, 'holder ran');
ok t_cmp(scalar(@ok) . ' ok, ' . scalar(@busy) . ' busy', '1 ok, 3 busy',
         'one queued, three rejected');
# Immediate: the module's own measure of each one's time in the zone is far
# below the zone's 20-s timeout, and they were answered while the holder
# still ran.
my @waited = map { ($_->{body} =~ /wait_us=(\d+)/)[0] // 9e9 } @busy;
ok t_cmp(scalar(grep { $_ < 500_000 } @waited) . ($early ? ', holder running' : ', holder released'),
         '3, holder running',
         sprintf('rejections are immediate (%s us in the zone; %s s at the client)',
                 join(' ', @waited), join(' ', map { sprintf '%.3f', $_->{secs} } @busy)));
ok t_cmp(scalar(grep { ($_->{headers}{'retry-after'} // '') =~ /^[1-9]\d*$/ } @busy), 3,
         'each 503 carries Retry-After >= 1');
ok t_cmp(scalar(grep { $_->{body} =~ /custom 503 page: zone=small result=rejected-full/ }
                @busy), 3, 'ErrorDocument 503 is used and sees the outcome');

# Timeout: limit 1 held until the late request has its answer, timeout
# 300ms, retry_after=7.
probe_reset('tmo');
$hold = bg_get('/tmo/probe.cgi?tag=tmo&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('tmo'))[0] == 1 }) or die 'holder never started';
my $t = http_get('/tmo/probe.cgi?tag=tmo&id=late', timeout => 15);
probe_release('tmo');
bg_wait($hold);
ok t_cmp($t->{status}, 503, 'waiting past the timeout gives 503');
# After the timeout, not at once, and well before 1.5 s: the module's own
# measure of the wait.
my ($tw) = $t->{body} =~ /wait_us=(\d+)/;
ok t_cmp(defined $tw && $tw >= 300_000 && $tw < 1_500_000 ? 1 : 0, 1,
         sprintf('after about 300 ms (%s us in the zone; %.3f s at the client)', $tw // '?',
                 $t->{secs}));
ok t_cmp($t->{headers}{'retry-after'}, 7, 'configured Retry-After');
ok t_cmp($t->{body}, qr/result=rejected-timeout/, 'outcome rejected-timeout');
ok t_cmp(scalar(grep { $_->[0] eq 'late' } probe_order('tmo')), 0,
         'the timed-out request never ran');

sleep 0.2; # the log line is written after the response
open my $log, '<', $log_file or die;
seek $log, $log_start, 0;
my @lines = grep { /"GET \/small\/probe/ } <$log>;
ok t_cmp(scalar(grep { /\s503 small rejected-full \d+$/ } @lines), 3,
         'LogFormat %{THROTTLE_*}e records the rejections');
