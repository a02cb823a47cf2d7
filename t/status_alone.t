# Without mod_status the module starts and serves its own status page with
# no error; and at the default LogLevel nothing is logged per request, for
# requests that ran in a zone and requests it refused.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);

plan tests => 6,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => ($ENV{INHERIT_CONF} && -f $ENV{INHERIT_CONF}) };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $srv = private_server(cgi_conf($probes) . <<'CONF', without => ['status']);
ThrottleZone alone limit=1 queue=0
<Location /cgi-bin/>
    Throttle alone
</Location>
<Location /throttle-status>
    SetHandler throttle-status
</Location>
CONF
my $r = $srv->{get}->('/throttle-status?auto');
$srv->{get}->('/throttle-status?json') for 1 .. 5;
# One request runs in the zone while two more are refused.
my $hold = bg_get('/cgi-bin/probe.cgi?tag=alone&sleep=1500', port => $srv->{port});
wait_until(sub { (probe_count_in($probes, 'alone'))[0] == 1 }, 10) or die 'never ran';
my @refused = grep { $_->{status} == 503 }
              map { http_get('/cgi-bin/probe.cgi?tag=alone', port => $srv->{port}) } 1 .. 2;
my $ran = bg_wait($hold);
$srv->{stop}->();
my $log = $srv->{log}->();

ok t_cmp($r->{raw}, qr{^HTTP/1\.\d 200}, 'status page answers without mod_status');
ok t_cmp($r->{body}, qr{^Throttle\.alone\.Limit: 1\r?$}m, 'with the zone');
my @errors = grep { /:(emerg|alert|crit|error)\]/ } split /\n/, $log;
# t_cmp's own report shows only with -verbose; CI's summary keeps this.
print STDERR "# status_alone.t: error in the log: $_\n" for @errors;
ok t_cmp(scalar @errors, 0, 'no error in the log');
ok t_cmp($log, qr/resuming normal operations/, 'the server ran');
ok t_cmp($ran->{status} . ' ' . scalar(@refused), '200 2',
         'a request ran in the zone and two were refused meanwhile');
ok t_cmp(join('', grep { /adaptive_throttle/ } split /\n/, $log), '',
         'nothing from the module per request at the default LogLevel');
