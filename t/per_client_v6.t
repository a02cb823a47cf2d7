# per_client over IPv6: ::1 is a client like any other (its first 64 bits
# are zero, which the table once took for "nobody": the limit never applied),
# and per_client_v6 sets how many of an address's leading bits name the
# client: two addresses of one /64 (given by mod_remoteip from a header, as
# a proxy in front would) are one client by default, two at /128.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use IO::Socket::IP;
use File::Temp qw(tempdir);

my $have_v6 = IO::Socket::IP->new(LocalHost => '::1', LocalPort => 0, Listen => 1) ? 1 : 0;
my $moddir = do { my $apxs = $ENV{APXS} || 'apxs'; my $d = `$apxs -q LIBEXECDIR`; chomp $d; $d };
plan tests => 6, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                        'IPv6 loopback (::1)' => $have_v6,
                        'mod_remoteip' => -f "$moddir/mod_remoteip.so" };

my $port6 = free_port('::1');
my $cgi = Apache::Test::vars('serverroot') . '/cgi-bin';
my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $srv = private_server(<<"CONF", ready => '/ts?auto');
LoadModule remoteip_module $moddir/mod_remoteip.so
RemoteIPHeader X-Client-IP
RemoteIPInternalProxy ::1
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
# A request over ::1 whose answer is read later; $as: the client address
# the proxy in front says it came from.
sub open6 {
    my ($path, $as) = @_;
    my $s = IO::Socket::IP->new(PeerHost => '::1', PeerPort => $port6, Timeout => 20)
        or die "connect [::1]:$port6: $!";
    my $h = $as ? "X-Client-IP: $as\r\n" : '';
    print $s "GET $path HTTP/1.0\r\nHost: [::1]\r\n$h\r\n";
    return $s;
}
sub answer { my $s = shift; local $/; my $raw = <$s> // ''; ($raw =~ m{^HTTP/\S+ (\d+)})[0] // 0 }
sub zone { zone_stat($srv, @_) }

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

# Two addresses of one /64: one client by default, two at /128.
my ($a, $b) = ('2001:db8:1:2::a', '2001:db8:1:2::b');
for my $z (qw(one wide)) {
    $first = open6("/$z/probe.cgi?tag=v6&sleep=3000", $a);
    wait_until(sub { zone($z, 'Active') == 1 }, 10) or die "the first request never ran ($z)";
    my $second = answer(open6("/$z/probe.cgi?tag=v6", $b));
    answer($first);
    ok t_cmp($second, $z eq 'one' ? 503 : 200,
             $z eq 'one' ? "$a and $b share a /64: one client, the second refused"
                         : "per_client_v6=/128: $a and $b are two clients, both served");
}
$srv->{stop}->();
