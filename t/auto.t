# limit=auto in a real server: on a CPU-burning CGI the limit settles near
# the number of CPUs; on a CGI that sleeps it climbs; a newcomer whose wait
# would outlast the timeout gets 503 at once (rejected-predicted).
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time sleep);

plan tests => 10, need_cgi;

my $cpus = do { my $n = `getconf _NPROCESSORS_ONLN`; chomp $n; $n || 1 };

# Runs $clients clients on $path for $secs seconds while sampling the zone's
# limit four times a second; returns the samples, and leaves the level the
# controller held at each in @held, its mode in @modes.
our (@held, @modes);
sub limit_under_load {
    my ($zone, $path, $clients, $secs) = @_;
    my $pid = fork // die;
    if (!$pid) {
        load_loop($path, $clients, $secs);
        require POSIX;
        POSIX::_exit(0);
    }
    my @samples;
    my $end = time + $secs;
    @held = @modes = ();
    while (time < $end) {
        my $s = status_auto();
        push @samples, $s->{"Throttle.$zone.Limit"};
        push @held, $s->{"Throttle.$zone.LimitHeld"};
        push @modes, $s->{"Throttle.$zone.LimitMode"};
        sleep 0.25;
    }
    waitpid($pid, 0);
    return @samples;
}

sub mean { my $n = 0; $n += $_ for @_; @_ ? $n / @_ : 0 }

my $s = status_auto();
ok t_cmp($s->{'Throttle.autocpu.LimitAuto'} . ' ' . $s->{'Throttle.autocpu.Limit'},
         '1 ' . ($cpus * 2 > 16 ? 16 : $cpus * 2), 'limit=auto starts at twice the CPUs');

my @cpu = with_cpus(sub { limit_under_load('autocpu', '/autocpu/burn.cgi?ms=50', 10, 22) });
my @cpu_modes = @modes;
my @tail = @cpu[-32 .. -1];
my $m = mean(@tail);
print STDERR sprintf("# auto.t: CPU-burning CGI on %d CPUs: limit %s; mean of the last 8 s %.2f\n",
                     $cpus, join(' ', @cpu), $m);
# CPU-bound work must not be taken for work that waits, which climbs to
# max within seconds (below): the limit stays in the lower half between its
# start of 2 x the CPUs and max=16. Where exactly depends on what else the
# machine runs: on a busy one noise can hold it a probe or two above the
# CPUs (docs/adaptive-limit.md, "Limits").
my $start = $cpus * 2 > 16 ? 16 : $cpus * 2;
my $half = ($start + 16) / 2;
ok t_cmp($m >= 1 && ($m < $half || $start == 16), 1,
         sprintf('CPU-bound: the limit stays below %.1f, half way from its start of %d to max (mean %.2f)',
                 $half, $start, $m));
ok t_cmp(status_auto()->{'Throttle.autocpu.LimitChanges'} >= 1, 1, 'the limit moved');
# LimitHeld is the level a probe goes back to: the limit runs at it except
# while a step away is under test, so over the run most samples match it,
# none is more than a step (80 %, or 1, and the rounding of both) from it, and it moves no more often
# than the limit, which leaves it and comes back for each probe. Only
# whole-run figures: while the limit walks down, each step's window is
# spent a step below the held level, and on a busy machine that can be
# most of the last seconds.
my $same = grep { defined $held[$_] && $held[$_] == $cpu[$_] } 0 .. $#cpu;
my $far = grep { !defined $held[$_] || abs($cpu[$_] - $held[$_]) > ($held[$_] * 0.8 < 1 ? 1 : $held[$_] * 0.8) + 1 }
          0 .. $#cpu;
sub moves { scalar grep { $_[$_] != $_[$_ - 1] } 1 .. $#_ }
my ($lm, $hm) = (moves(@cpu), moves(grep { defined } @held));
print STDERR "# auto.t: held levels @held; moves: limit $lm, held $hm\n";
ok t_cmp($same >= @cpu / 2 && !$far && $hm <= $lm
         && !grep({ !defined || $_ < 1 || $_ > 16 } @held), 1,
         "the held level is where the limit runs ($same of " . @cpu . ' samples),'
         . " a step from it at most ($far further), moves no more ($hm against $lm), within min and max");

# LimitMode says what the controller does: one of its five modes in every
# sample; over 22 s under load it holds a level and tries others.
my %seen;
$seen{$_ // 'none'}++ for @cpu_modes;
print STDERR "# auto.t: modes seen: ", join(' ', map { "$_ $seen{$_}" } sort keys %seen), "\n";
ok t_cmp(!grep({ !/^(?:hold|shed|step|probe|between)$/ } map { $_ // 'none' } @cpu_modes)
         && $seen{hold} && grep({ $seen{$_} } qw(step probe between shed)) ? 1 : 0, 1,
         'LimitMode is a mode in every sample; both holding and stepping were seen');

# Long sleeps, so that starting perl (CPU) is a small part of each request.
my @wait = limit_under_load('autowait', '/autowait/probe.cgi?tag=autowait&sleep=400', 24, 20);
my $mw = mean(@wait[-32 .. -1]);
print STDERR sprintf("# auto.t: sleeping CGI: limit %s; mean of the last 8 s %.2f\n",
                     join(' ', @wait), $mw);
# How high depends on what else each request costs here (starting perl,
# mod_cgid's daemon forking every CGI); what matters is the direction.
ok t_cmp($mw >= 5 && $mw > $m + 1, 1,
         sprintf('sleep-bound: the limit climbs from 4 (mean %.2f; CPU-bound %.2f)', $mw, $m));
my (undef, $ran) = probe_count('autowait');
ok t_cmp($ran > 4 && $ran <= 12, 1,
         "the CGIs themselves saw more than the start of 4 at once, never more than max=12 ($ran)");

# autopred: limit 1, timeout 300 ms. One request of 600 ms teaches the zone
# its service time; then, with the slot taken, a newcomer would wait about
# 600 ms: refused at once.
http_get('/autopred/probe.cgi?tag=autopred&sleep=600');
my $hold = bg_get('/autopred/probe.cgi?tag=autopred&sleep=1500');
wait_until(sub { status_auto()->{'Throttle.autopred.Active'} == 1 }) or die 'holder not in';
my $r = http_get('/autopred/probe.cgi?tag=autopred');
ok t_cmp($r->{status}, 503, 'a newcomer that would wait past the timeout gets 503');
ok t_cmp($r->{body}, qr/result=rejected-predicted/, 'THROTTLE_RESULT=rejected-predicted');
ok t_cmp($r->{secs} < 0.25, 1, sprintf('at once (%.3f s), not after the 300 ms timeout', $r->{secs}));
bg_wait($hold);
