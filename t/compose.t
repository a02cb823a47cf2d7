# Defaults that compose: one zone's default queue may not take the workers
# another zone needs. With MaxRequestWorkers 256, two limit=auto zones and
# a fixed zone of limit 64 whose default queue would be 640, every zone
# gets at least its share of the workers; and a configuration whose
# defaults cannot fit at all fails the configuration check, saying what to
# set, instead of starting zones that serve one request at a time.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 5, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $mpm = <<'CONF';
<IfModule mpm_prefork_module>
    StartServers 2
    ServerLimit 256
    MaxRequestWorkers 256
</IfModule>
<IfModule !mpm_prefork_module>
    StartServers 1
    ServerLimit 16
    ThreadsPerChild 16
    MaxRequestWorkers 256
</IfModule>
CONF
my $srv = private_server($mpm . <<'CONF', ready => '/ts?auto');
ThrottleZone cpu limit=auto
ThrottleZone io limit=auto
ThrottleZone fix limit=64
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
my %v = $srv->{get}->('/ts?auto')->{body} =~ /^Throttle\.(\w+\.\w+): (\S+)$/mg;
# 256 workers less 12 kept idle (5 %), over 3 zones: 81 each.
my $fair = int((256 - 12) / 3);
ok t_cmp("$v{'fix.Limit'} " . ($v{'fix.Limit'} + $v{'fix.QueueCapacity'} <= $fair ? 'fits' : 'over'),
         '64 fits', "the fixed zone's default queue is cut to its share ($fair workers)");
for my $z (qw(cpu io)) {
    ok t_cmp($v{"$z.LimitMax"} + $v{"$z.QueueCapacity"} >= $fair ? 'a fair share' : 'starved',
             'a fair share', "limit=auto zone $z may hold a fair share of the workers "
             . "(max $v{\"$z.LimitMax\"} + queue $v{\"$z.QueueCapacity\"})");
}
my @warned = $srv->{log}->() =~ /zones' running \+ waiting requests/g;
ok t_cmp(scalar @warned, 0, 'together they fit the workers: no warning');
$srv->{stop}->();

# Too few workers for the defaults of 3 zones: configtest says what to set.
my $few = ($ENV{MPM} // '') eq 'prefork'
    ? "MaxRequestWorkers 4\n"
    : "ServerLimit 1\nThreadsPerChild 4\nMaxRequestWorkers 4\n";
my $err = configtest($few . "ThrottleZone a limit=auto\nThrottleZone b limit=auto\n"
                     . "ThrottleZone c limit=2\n");
ok t_cmp($err =~ /too few for their default queue= and limit=auto's max=; raise MaxRequestWorkers, or give each zone queue=/ ? 'refused, saying what to set' : "passed: $err",
         'refused, saying what to set', 'defaults that cannot fit fail httpd -t');
