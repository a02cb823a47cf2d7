# Refusals are logged at info, every decision at debug: with httpd's own
# per-module level ("LogLevel warn adaptive_throttle:info") the error log
# shows each refusal and nothing of the requests that ran; at warn, neither.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);

plan tests => 4, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

sub run_with {
    my ($level) = @_;
    my $probes = tempdir(CLEANUP => 1);
    chmod 0777, $probes;
    my $srv = private_server("LogLevel $level\nThrottleZone lone limit=1 queue=0\n"
                             . cgi_conf($probes) . "<Location /cgi-bin/>\n"
                             . "    Throttle lone\n</Location>\n");
    my $hold = bg_get('/cgi-bin/probe.cgi?tag=lone&sleep=1500', port => $srv->{port});
    wait_until(sub { (probe_count_in($probes, 'lone'))[0] == 1 }, 10) or die 'never ran';
    my @r = map { http_get('/cgi-bin/probe.cgi?tag=lone', port => $srv->{port}) } 1 .. 2;
    bg_wait($hold);
    $srv->{stop}->();
    my $log = $srv->{log}->();
    return (scalar(grep { $_->{status} == 503 } @r),
            scalar(() = $log =~ /zone lone: rejected-full/g),
            scalar(() = $log =~ /zone lone: admitted/g));
}

my ($refused, $logged, $admitted) = run_with('warn adaptive_throttle:info');
ok t_cmp($refused, 2, 'two requests refused while the slot was held');
ok t_cmp($logged, 2, 'adaptive_throttle:info logs each refusal');
ok t_cmp($admitted, 0, 'and not the request that ran');
($refused, $logged) = run_with('warn');
ok t_cmp("$refused $logged", '2 0', 'at warn, the two refusals are not logged');
