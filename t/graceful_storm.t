# Graceful restarts every 2 s for 20 s under sustained overload: the running
# CGIs never see more than the cap, nothing fails but by the module's 503,
# counters never go backwards, a changed zone definition takes effect while
# an unchanged one keeps its state. Then a hard restart (-k restart).
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use Storable qw(store retrieve);
use Time::HiRes qw(time sleep);
use POSIX ();

plan tests => 12, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $cgi_dir = Apache::Test::vars('serverroot') . '/cgi-bin';
my $probe = Apache::Test::vars('t_logs') . '/probe';
my $spool = tempdir(CLEANUP => 1);
my $zones = "$spool/zones.conf";

sub write_zones {
    my ($limit) = @_;
    open my $fh, '>', $zones or die;
    print $fh "ThrottleZone hot  limit=$limit queue=4 timeout=20s\n",
              "ThrottleZone calm limit=1 queue=0\n";
    close $fh;
}
write_zones(2);

# mod_cgi under every MPM: mod_cgid restarts its daemon at each graceful
# restart, and a request caught then fails with mod_cgid's own 503 while its
# CGI may run on, out of httpd's sight (seen here about once in 15 runs).
# That would be measured here as the module's fault; it is not.
my $srv = private_server(<<"CONF", cgi_not_cgid => 1);
Include $zones
LogLevel adaptive_throttle:debug
SetEnv PROBE_DIR $probe
ScriptAlias /hot/  "$cgi_dir/"
ScriptAlias /calm/ "$cgi_dir/"
<Directory "$cgi_dir">
    Options +ExecCGI
    Require all granted
</Directory>
<Location /hot/>
    Throttle hot
</Location>
<Location /calm/>
    Throttle calm
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF

sub status {
    my %s = map { /^([^:]+):\s*(.*)$/ ? ($1, $2) : () }
            split /\n/, $srv->{get}->('/ts?auto')->{body};
    return \%s;
}

sub restarts { scalar(() = $srv->{log}->() =~ /resuming normal operations/g) }

sub restart {
    my ($signal) = @_;
    my $before = restarts();
    kill $signal, $srv->{pid} or die "cannot signal the server: $!";
    wait_until(sub { restarts() > $before }, 20) or die "$signal restart did not finish";
}

# Forked helpers report through files in the spool.
sub spawn {
    my ($name, $code) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        store($code->(), "$spool/$name.$$");
        POSIX::_exit(0);
    }
    return [$name, $pid];
}

sub collect {
    my ($h) = @_;
    waitpid($h->[1], 0);
    return retrieve("$spool/$h->[0].$h->[1]");
}

unlink glob "$probe/{hot,calm}.*";

# The calm zone: a request that runs across every restart must keep its slot.
my $calm_start = status()->{'Throttle.calm.Admitted'};
my $calm = spawn('calm', sub { [ $srv->{get}->('/calm/probe.cgi?tag=calm&sleep=21000')->{status} ] });
wait_until(sub { status()->{'Throttle.calm.Active'} == 1 }) or die 'calm holder not in';

# 8 clients on a zone of 2 + 4: at any time 2 run, 4 wait, the rest get 503;
# until the restarts are over (told by a file), however long they take. A
# refused client asks again 50 ms later, as a client that backs off does:
# the overload is as sustained, at a tenth of the requests.
my $done = "$spool/restarts-done";
my @load = map {
    spawn('load', sub {
        my $end = time + 300;
        my @st;
        while (time < $end && !-e $done) {
            my $r = $srv->{get}->('/hot/probe.cgi?tag=hot&sleep=100');
            # The module's 503 carries Retry-After; another module's would not.
            push @st, $r->{status} == 503 && $r->{raw} !~ /\r\nRetry-After: \d+\r\n/i
                      ? '503-not-ours' : $r->{status};
            sleep 0.05 if $r->{status} == 503;
        }
        \@st;
    })
} 1 .. 8;

# Counters sampled four times a second, each sample with the times its
# request went out and came back, until the restarts are over (told by a
# file) and one sample more.
my @keys = map { "Throttle.$_" }
    qw(hot.Admitted hot.QueuedTotal hot.RejectedFull hot.RejectedTimeout hot.Aborted
       hot.Reclaimed calm.Admitted);
# One sample: [sent, answered, the counters], or nothing if unanswered.
sub sample {
    my $t0 = time;
    my $s = status();
    return defined $s->{$keys[0]} ? ([ $t0, time, map { $s->{$_} } @keys ]) : ();
}
my $sampler = spawn('samples', sub {
    my $end = time + 300;
    my @samples;
    my $last;
    while (time < $end) {
        $last = -e $done;
        my @s = sample();
        push @samples, @s;
        last if $last && @s;
        sleep 0.25;
    }
    \@samples;
});

# Ten graceful restarts, 2 s apart; after the fifth the hot zone grows to 3.
sub probe_max { (probe_count_in($probe, 'hot'))[1] }

# The loop also samples once before each restart and after the last, so
# that every interval has a sample however slowly the sampler's come back
# on a loaded machine.
my ($calm_blocked, $max_before, @restarted, @steps);
for my $n (1 .. 10) {
    sleep 2;
    push @steps, sample();
    if ($n == 6) {
        # The highest concurrency so far was seen under limit 2.
        $max_before = probe_max();
        write_zones(3);
    }
    my $t0 = time;
    restart('USR1');
    push @restarted, [$t0, time];
    $calm_blocked //= $srv->{get}->('/calm/probe.cgi?tag=calm2')->{status} if $n == 3;
}
push @steps, sample();
open my $fh, '>', $done or die;
close $fh;
my $limit_after = status()->{'Throttle.hot.Limit'};

my @st = map { @{ collect($_) } } @load;
my $samples = collect($sampler);
my $calm_status = collect($calm)->[0];

my $max_after = probe_max();

# Who ran at the busiest moment, from the CGIs' own start and end records:
# printed only if a check of the cap fails.
sub peak_report {
    open(my $fh, '<', "$probe/hot.events") or return "# no events\n";
    my (%open, @peak, $max);
    $max = 0;
    while (<$fh>) {
        my ($op, $t, $pid, $ppid) = split;
        if ($op eq '+') { $open{$pid} = "$t cgi $pid httpd $ppid" } else { delete $open{$pid} }
        if (keys %open > $max) { $max = keys %open; @peak = sort values %open }
    }
    return join '', "# peak of $max running CGIs:\n", map { "#   $_\n" } @peak;
}

my %by;
$by{$_}++ for @st;
my $summary = join ', ', map { "$_: $by{$_}" } sort keys %by;
print STDERR "# graceful_storm.t ($ENV{MPM}): 10 graceful restarts, statuses $summary; "
    . "max running $max_before under limit 2, $max_after over the whole run\n";

ok t_cmp(scalar(@st) > 50 && ($by{503} // 0) > 0 && ($by{200} // 0) > 0, 1,
         "sustained overload: $summary");
ok t_cmp(scalar(grep { $_ ne '200' && $_ ne '503' } @st), 0,
         "nothing failed but by the module's 503 (with Retry-After)");
ok t_cmp($max_before <= 2 && $max_before > 0, 1, "at most 2 ran at once with limit 2 ($max_before)");
# 3 running at once: the new limit was applied, not only reported.
ok t_cmp($max_after, 3, "with limit 3, the CGIs saw exactly 3 at once at most ($max_after)")
    or print STDERR peak_report();
ok t_cmp($limit_after, 3, 'the changed definition took effect');

# Each series in its own order: a sample of one can overlap one of the
# other in time, and then their order is not known.
my @backwards;
for my $series ($samples, \@steps) {
    for my $i (1 .. $#$series) {
        for my $k (0 .. $#keys) {
            push @backwards, "$keys[$k] $series->[$i-1][$k+2] -> $series->[$i][$k+2]"
                if $series->[$i][$k+2] < $series->[$i-1][$k+2];
        }
    }
}
# What "no counter went backwards" needs: samples before the first
# restart, between each two, and after the last.
my @between = map {
    my ($from, $to) = ($_ ? $restarted[$_ - 1][1] : 0, $_ < @restarted ? $restarted[$_][0] : 9e9);
    scalar grep { $_->[0] >= $from && $_->[1] <= $to } @$samples, @steps
} 0 .. @restarted;
ok t_cmp(!grep({ $_ < 1 } @between) ? 1 : 0, 1, sprintf('%d samples of the counters; before, '
         . 'between and after the 10 restarts: %s', @$samples + @steps, join(' ', @between)));
ok t_cmp(join('; ', @backwards), '', 'no counter went backwards');

ok t_cmp($calm_blocked, 503, 'the unchanged zone still knew its slot was held');
ok t_cmp($calm_status, 200, 'the request running across all ten restarts finished');
ok t_cmp(status()->{'Throttle.calm.Admitted'} - $calm_start, 1,
         'the unchanged zone kept its counts');

# A hard restart kills the children; what they held comes back.
unlink glob "$probe/hard.*";
my @hard = map { spawn('hard', sub { [ $srv->{get}->('/hot/probe.cgi?tag=hard&sleep=3000')->{status} ] }) } 1 .. 5;
wait_until(sub { status()->{'Throttle.hot.Active'} == 3 }) or die 'hard-restart load not in';
restart('HUP');
collect($_) for @hard;
ok t_cmp(wait_until(sub { my $s = status(); $s->{'Throttle.hot.Active'} == 0
                                            && $s->{'Throttle.hot.Queued'} == 0 }, 5), 1,
         'after -k restart nothing is left held or queued');
my @after = map { $srv->{get}->('/hot/probe.cgi?tag=post') } 1 .. 3;
ok t_cmp(join(' ', map { $_->{status} } @after), '200 200 200', 'and the zone serves again');
$srv->{stop}->();
