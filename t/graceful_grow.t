# A graceful restart that grows a zone past the shared memory laid for it
# (here its queue, past 256 places) lays a new zone while the old children
# still run requests admitted by the old one. What runs and waits in the
# old zone counts against the new limit, and the old zone refuses
# newcomers (a connection an old child takes before it has read the
# restart): the CGIs never see more than the limit running at once across
# the restart. Once the old zone is idle, the parent frees it.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);

plan tests => 6, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $spool = tempdir(CLEANUP => 1);
my $zones = "$spool/zones.conf";
sub write_zone {
    my ($queue) = @_;
    open my $fh, '>', $zones or die;
    print $fh "ThrottleZone grow limit=2 queue=$queue timeout=60s\n";
    close $fh;
}
write_zone(8);
# mod_cgi: mod_cgid restarts its daemon at a graceful restart (see
# graceful_storm.t). No workers kept idle: right after the restart the new
# children are still starting their threads, and on a busy machine a
# request that would wait then is refused (rejected-workers), which is
# keep_idle.t's matter, not this test's. Each answer's child is logged.
# One spare is enough: with httpd's default spares, the two old CGIs leave
# too few idle workers, and the parent forks one more child as it takes the
# restart signal, before it starts the new generation. That child is of
# the old one, missing from %gen1, and refuses what it takes (every run
# showed one).
my $srv = private_server("Include $zones\nLogLevel adaptive_throttle:debug\n"
                         . "ThrottleKeepIdleWorkers 0\n"
                         . "<IfModule mpm_prefork_module>\n    MinSpareServers 1\n</IfModule>\n"
                         . "<IfModule !mpm_prefork_module>\n    MinSpareThreads 1\n</IfModule>\n"
                         . "LogFormat \"%P %>s %U%q\" bypid\n"
                         . "CustomLog $spool/access_log bypid\n"
                         . "<Location /ts>\n    SetHandler throttle-status\n</Location>\n"
                         . cgi_conf($probes) . "<Location /cgi-bin/>\n    Throttle grow\n"
                         . "</Location>\n", cgi_not_cgid => 1);
sub resumed { scalar(() = $srv->{log}->() =~ /resuming normal operations/g) }

# The two old CGIs run until released, however slow the machine.
my @old = map { bg_get("/cgi-bin/probe.cgi?tag=grow&sleep=120000&release=1&id=o$_", port => $srv->{port}) }
          1 .. 2;
wait_until(sub { (probe_count_in($probes, 'grow'))[0] == 2 }, 30) or die 'the first two never ran';
write_zone(300);
my $before = resumed();
my %gen1 = map { $_ => 1 } children_of($srv->{pid});
kill 'USR1', $srv->{pid};
wait_until(sub { resumed() > $before }, 30) or die 'no graceful restart';

# The new zone is the one with 300 places; the status page may be served
# by an old child, which shows the old zone.
sub new_zone_queued {
    my $body = $srv->{get}->('/ts?auto')->{body};
    my ($cap) = $body =~ /^Throttle\.grow\.QueueCapacity: (\d+)$/m;
    my ($q) = $body =~ /^Throttle\.grow\.Queued: (\d+)$/m;
    return defined $cap && $cap == 300 ? $q : 0;
}
# New requests, one at a time, until one waits in the new zone beside the
# two old ones (an old child may take some, and refuse them).
my (@new, $waited);
for my $i (1 .. 8) {
    push @new, bg_get("/cgi-bin/probe.cgi?tag=grow&sleep=300&id=n$i", port => $srv->{port});
    last if ($waited = wait_until(sub { new_zone_queued() >= 1 }, 3));
}
my ($running) = probe_count_in($probes, 'grow');
ok t_cmp($waited && $running == 2 ? 1 : 0, 1,
         'a new request waits in the new zone while the old zone runs its two');
probe_release('grow', $probes);
my @ro = map { bg_wait($_) } @old;
my @rn = map { bg_wait($_) } @new;
my ($cur, $max) = probe_count_in($probes, "grow");
print STDERR "# graceful_grow.t: old " . join(" ", map { $_->{status} } @ro) . "; new "
    . join(" ", map { "$_->{status}" . ($_->{body} =~ /result=(\S+)/ ? ":$1" : "") } @rn) . "\n";
ok t_cmp(scalar(grep { $_->{status} == 200 } @ro), 2, 'the old two answered 200');
# A 503 only from a child of the old generation (the old zone refuses
# newcomers); the new zone queues every request its children take.
my $logged = wait_until(sub { my @l = access_lines(); @l >= @ro + @rn }, 10);
sub access_lines {
    open my $fh, '<', "$spool/access_log" or return ();
    return grep { m{/cgi-bin/probe\.cgi} } <$fh>;
}
my @refused_by_new = grep { /^(\d+) 503 / && !$gen1{$1} } access_lines();
ok t_cmp(scalar(grep { $_->{status} == 200 || $_->{status} == 503 } @rn) == @rn
         && $logged && !@refused_by_new ? 1 : 0, 1,
         'every new request answered 200, or 503 by an old child only')
    or do {
        my @l = access_lines();
        print STDERR "# access_log: " . @l . " lines of " . (@ro + @rn) . " answers\n",
            map { "# access: $_" } @l;
    };
ok t_cmp($max, 2, 'the CGIs never saw more than the limit of 2 running across the restart');
ok t_cmp($srv->{log}->() =~ /zone grow: its shared memory cannot be kept.*they count against the new limit/ ? 1 : 0,
         1, 'the log says the zone was laid anew and the old one counted');
# The parent frees the old zone once idle (at its next maintenance pass,
# about every 10 s in httpd 2.4).
ok t_cmp(wait_until(sub { $srv->{log}->() =~ /freed the shared memory of a replaced zone/ }, 25),
         1, 'the old zone is freed once idle');
$srv->{stop}->();
