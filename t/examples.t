# The example configurations in conf/examples parse, so does the shipped
# conf/adaptive_throttle.conf as is and with its setups uncommented, and
# the CGI example throttles requests that come from this host: a reverse proxy on the same
# machine sends every request from 127.0.0.1, so bypassing loopback would
# turn the throttle off for all of them.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);

my $examples = Apache::Test::vars('serverroot') . '/../examples';
plan tests => 4, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                        'conf/examples copied beside the suite' => -d $examples };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $srv = private_server("Include $examples/cgi.conf\n" . cgi_conf($probes));
my $r = $srv->{get}->('/cgi-bin/probe.cgi?tag=example');
ok t_cmp("$r->{status} " . ($r->{body} =~ /result=(\S+)/)[0], '200 admitted',
         'a CGI request from 127.0.0.1 is throttled, not bypassed');
$srv->{stop}->();

# Every example parses (httpd -t), with the modules it needs.
my @bad = map { my $e = configtest("Include $_\n"); $e ? "$_: $e" : () } glob "$examples/*.conf";
print STDERR "# examples.t: $_" for @bad;
ok t_cmp(scalar @bad, 0, 'every example in conf/examples passes httpd -t');

# The configuration the packages install: safe as is, and each setup its
# comments show is a working configuration once uncommented.
my $shipped = Apache::Test::vars('serverroot') . '/../shipped/adaptive_throttle.conf';
my $as_is = -f $shipped ? configtest("Include $shipped\n") : "no $shipped";
print STDERR "# examples.t: $as_is" if $as_is;
ok t_cmp($as_is, '', 'the shipped adaptive_throttle.conf passes httpd -t as is');
my $dir = tempdir(CLEANUP => 1);
my $n = 0;
if (open my $in, '<', $shipped) {
    open my $out, '>', "$dir/uncommented.conf" or die;
    while (my $line = <$in>) {
        $n++ if $line =~ s/^(\s*)#(Throttle\w+ )/$1$2/;
        print $out $line;
    }
}
my $uncommented = configtest("Include $dir/uncommented.conf\n");
print STDERR "# examples.t: $uncommented" if $uncommented;
ok t_cmp("$n lines, " . ($uncommented || 'httpd -t ok'), '6 lines, httpd -t ok',
         'its three setups, uncommented, pass httpd -t');
