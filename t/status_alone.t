# Without mod_status the module starts and serves its own status page with
# no error; and at the default LogLevel nothing is logged per request.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 5,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => ($ENV{INHERIT_CONF} && -f $ENV{INHERIT_CONF}) };

my $srv = private_server(<<'CONF', without => ['status']);
ThrottleZone alone limit=1 queue=0
<Location /throttle-status>
    SetHandler throttle-status
</Location>
CONF
my $r = $srv->{get}->('/throttle-status?auto');
$srv->{get}->('/throttle-status?json') for 1 .. 5;
$srv->{stop}->();
my $log = $srv->{log}->();

ok t_cmp($r->{raw}, qr{^HTTP/1\.\d 200}, 'status page answers without mod_status');
ok t_cmp($r->{body}, qr{^Throttle\.alone\.Limit: 1\r?$}m, 'with the zone');
my @errors = grep { /:(emerg|alert|crit|error)\]/ } split /\n/, $log;
# t_cmp's own report shows only with -verbose; CI's summary keeps this.
print STDERR "# status_alone.t: error in the log: $_\n" for @errors;
ok t_cmp(scalar @errors, 0, 'no error in the log');
ok t_cmp($log, qr/resuming normal operations/, 'the server ran');
ok t_cmp(join('', grep { /adaptive_throttle/ } split /\n/, $log), '',
         'nothing from the module per request at the default LogLevel');
