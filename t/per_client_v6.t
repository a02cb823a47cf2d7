# per_client over IPv6: ::1 is a client like any other (its first 64 bits
# are zero, which the table once took for "nobody": the limit never applied),
# and per_client_v6 sets how many of an address's leading bits name the
# client.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use IO::Socket::IP;
use File::Temp qw(tempdir);

my $have_v6 = IO::Socket::IP->new(LocalHost => '::1', LocalPort => 0, Listen => 1) ? 1 : 0;
plan tests => 4, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                        'IPv6 loopback (::1)' => $have_v6 };

my $port6 = IO::Socket::IP->new(LocalHost => '::1', LocalPort => 0, Listen => 1)->sockport;
my $cgi = Apache::Test::vars('serverroot') . '/cgi-bin';
my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $srv = private_server(<<"CONF", ready => '/ts?auto');
Listen [::1]:$port6
ThrottleZone one limit=4 queue=4 timeout=10s per_client=1
ThrottleZone wide limit=4 queue=4 timeout=10s per_client=1 per_client_v6=/128
SetEnv PROBE_DIR $probes
<Directory "$cgi">
    Options +ExecCGI
    Require all granted
</Directory>
ScriptAlias /one/ "$cgi/"
ScriptAlias /wide/ "$cgi/"
<Location /one/>
    Throttle one
</Location>
<Location /wide/>
    Throttle wide
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF

# A request over ::1 whose answer is read later.
sub open6 {
    my ($path) = @_;
    my $s = IO::Socket::IP->new(PeerHost => '::1', PeerPort => $port6, Timeout => 20)
        or die "connect [::1]:$port6: $!";
    print $s "GET $path HTTP/1.0\r\nHost: [::1]\r\n\r\n";
    return $s;
}
sub answer { my $s = shift; local $/; my $raw = <$s> // ''; ($raw =~ m{^HTTP/\S+ (\d+)})[0] // 0 }
sub zone {
    my ($z, $k) = @_;
    return ($srv->{get}->('/ts?auto')->{body} =~ /^Throttle\.\Q$z\E\.\Q$k\E: (\d+)$/m)[0] // -1;
}

my $first = open6('/one/probe.cgi?tag=v6&sleep=3000');
wait_until(sub { zone('one', 'Active') == 1 }, 10) or die 'the first request never ran';
ok t_cmp(zone('one', 'Clients'), 1, '::1 is counted as a client');
ok t_cmp(answer(open6('/one/probe.cgi?tag=v6')), 503,
         'per_client=1: its second request at once is refused');
ok t_cmp(answer($first), 200, 'the first is served');

# per_client_v6=/128 keys ::1 by its whole address: still one client.
$first = open6('/wide/probe.cgi?tag=v6&sleep=3000');
wait_until(sub { zone('wide', 'Active') == 1 }, 10) or die 'the first request never ran';
ok t_cmp(answer(open6('/wide/probe.cgi?tag=v6')), 503, 'at /128, ::1 is still one client');
answer($first);
$srv->{stop}->();
