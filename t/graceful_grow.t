# A graceful restart that grows a zone past the shared memory laid for it
# (here its queue, past 256 places) lays a new zone while the old children
# still run requests admitted by the old one. What runs in the old zone
# counts against the new limit: the CGIs never see more than the limit
# running at once across the restart. Once the old zone is idle, the
# parent frees it.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use Time::HiRes qw(time);

plan tests => 4, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $spool = tempdir(CLEANUP => 1);
my $zones = "$spool/zones.conf";
sub write_zone {
    my ($queue) = @_;
    open my $fh, '>', $zones or die;
    print $fh "ThrottleZone grow limit=2 queue=$queue timeout=20s\n";
    close $fh;
}
# A queue of 4 in the first zone as well: right after a graceful restart an
# old child that has not yet seen the restart may still accept a connection
# (event does on a busy machine) and queue it in the old zone.
write_zone(4);
# mod_cgi: mod_cgid restarts its daemon at a graceful restart (see
# graceful_storm.t). No workers kept idle: right after the restart the new
# children are still starting their threads, and on a busy machine a
# request that would wait then is refused (rejected-workers), which is
# keep_idle.t's matter, not this test's.
my $srv = private_server("Include $zones\nLogLevel adaptive_throttle:debug\n"
                         . "ThrottleKeepIdleWorkers 0\n"
                         . cgi_conf($probes) . "<Location /cgi-bin/>\n    Throttle grow\n"
                         . "</Location>\n", cgi_not_cgid => 1);
sub resumed { scalar(() = $srv->{log}->() =~ /resuming normal operations/g) }

my @old = map { bg_get("/cgi-bin/probe.cgi?tag=grow&sleep=3000&id=o$_", port => $srv->{port}) }
          1 .. 2;
wait_until(sub { (probe_count_in($probes, 'grow'))[0] == 2 }, 10) or die 'the first two never ran';

write_zone(300);
my $before = resumed();
kill 'USR1', $srv->{pid};
wait_until(sub { resumed() > $before }, 10) or die 'no graceful restart';
my @new = map { bg_get("/cgi-bin/probe.cgi?tag=grow&sleep=300&id=n$_", port => $srv->{port}) }
          1 .. 4;
my @r = map { bg_wait($_) } @old, @new;
my ($cur, $max) = probe_count_in($probes, "grow");
print STDERR "# graceful_grow.t: statuses " . join(" ", map { "$_->{status}" . ($_->{body} =~ /result=(\S+)/ ? ":$1" : "") . sprintf("/%.1fs", $_->{secs} // 0) } @r) . "\n";
ok t_cmp(scalar(grep { $_->{status} == 200 } @r), 6, 'every request answered 200')
    or print STDERR map { "# log: $_\n" } grep { /grow|503|refus/ } split /\n/, $srv->{log}->();
ok t_cmp($max, 2, 'the CGIs never saw more than the limit of 2 running across the restart');
ok t_cmp($srv->{log}->() =~ /zone grow: its shared memory cannot be kept.*they count against the new limit/ ? 1 : 0,
         1, 'the log says the zone was laid anew and the old one counted');
# The parent frees the old zone once idle (at its next maintenance pass,
# about every 10 s in httpd 2.4).
ok t_cmp(wait_until(sub { $srv->{log}->() =~ /freed the shared memory of a replaced zone/ }, 25),
         1, 'the old zone is freed once idle');
$srv->{stop}->();
