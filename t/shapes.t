# A slot covers the handler's work, whatever shape the handler has
# (docs/guarantees.md, "What a slot covers"). For each shape, 6 clients at
# once on a zone of limit=2: the backends count their own copies, and never
# more than 2 run at once, exactly 2 at some point, every request answered.
#   - a CGI that prints its headers after its work, and one that prints them
#     first (and flushes) then works; an nph- CGI; a CGI that writes more
#     than a pipe holds before it works
#   - the same through mod_deflate, a mod_rewrite [PT], and mod_include's
#     <!--#include virtual --> of the CGI (a subrequest)
#   - mod_proxy_http to a backend that streams its answer while it works
#   - HTTP/2: the 6 as streams of one connection (not under prefork)
#   - a WebSocket tunnel (proxy_http upgrade=websocket) holds its slot for
#     its lifetime
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time sleep);

my $apxs = $ENV{APXS} || 'apxs';
chomp(my $moddir = `$apxs -q LIBEXECDIR`);
# HTTP/2: why not, if not ('' when it runs)
my $no_h2 = ($ENV{MPM} // '') eq 'prefork' ? 'HTTP/2: mod_http2 does not serve under prefork'
          : !-f "$moddir/mod_http2.so" ? 'HTTP/2: no mod_http2'
          : system('/usr/bin/python3 -c "import h2" 2>/dev/null') != 0
              ? 'HTTP/2: no python3-h2 (scripts/setup installs it)' : '';
my $h2 = !$no_h2;
my @cgi_shapes = (['headers last', 'probe.cgi?x=1'], ['headers first', 'probe.cgi?first=1'],
                  ['nph-', 'nph-probe.cgi?x=1'], ['256 KiB before the work', 'probe.cgi?first=1&big=256']);
plan tests => 2 * (@cgi_shapes + 4) + 2 + 1 + 4,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
           map { ("mod_$_" => -f "$moddir/mod_$_.so") } qw(deflate include rewrite) };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $ssi = tempdir(CLEANUP => 1);
chmod 0755, $ssi;

# The streaming backend: a server of its own, outside every zone, whose CGI
# sends its headers first and then works.
my $backend = private_server(cgi_conf($probes, '/b/'));

# The WebSocket backend: answers the upgrade, then echoes until closed.
my $ws_listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 16,
                                      ReuseAddr => 1) or die "listen: $!";
my $ws_pid = fork // die;
if (!$ws_pid) {
    $SIG{CHLD} = 'IGNORE';
    while (my $c = $ws_listen->accept) {
        next if fork;
        my $head = '';
        while (defined(my $l = <$c>)) { last if $l =~ /^\r?\n$/; $head .= $l }
        print $c "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            . "Connection: Upgrade\r\n\r\n";
        $c->flush;
        while (sysread($c, my $buf, 4096)) { syswrite($c, $buf) }
        POSIX::_exit(0);
    }
    POSIX::_exit(0);
}
END { kill 'TERM', $ws_pid if $ws_pid }
my $ws_port = $ws_listen->sockport;
close $ws_listen;

my $srv = private_server(cgi_conf($probes, '/cgi/', '/gz/', '/ssione/cgi/') . <<"CONF");
LoadModule deflate_module $moddir/mod_deflate.so
LoadModule include_module $moddir/mod_include.so
LoadModule rewrite_module $moddir/mod_rewrite.so
@{[ $h2 ? "LoadModule http2_module $moddir/mod_http2.so\nProtocols h2c http/1.1\nH2Direct on\n" : '' ]}
ThrottleZone sh limit=2 queue=20 timeout=60s
ThrottleZone ws limit=1 queue=0
ThrottleZone one limit=1 queue=0
<Location /ssione/>
    Throttle one
</Location>
Alias /ssione/ "$ssi/"
ThrottleHandler cgi-script sh
<Location /gz/>
    SetOutputFilter DEFLATE
</Location>
RewriteEngine on
RewriteRule ^/pt/(.*)\$ /cgi/\$1 [PT]
Alias /ssi/ "$ssi/"
<Directory "$ssi">
    Options +Includes
    AddOutputFilter INCLUDES .shtml
    Require all granted
</Directory>
ProxyPass /proxied/ http://127.0.0.1:$backend->{port}/b/
<Location /proxied/>
    Throttle sh
</Location>
ProxyPass /ws/ http://127.0.0.1:$ws_port/ upgrade=websocket
<Location /ws/>
    Throttle ws
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF

sub zone { zone_stat($srv, @_) }

# 6 at once on $path (each 1 s of work, tagged $tag); returns the answers
# and the highest count the backends saw.
sub six_at_once {
    my ($tag, $path, %opt) = @_;
    my $sep = $path =~ /\?/ ? '&' : '?';
    my @pids = map { bg_get("$path${sep}tag=$tag&sleep=1000&id=$tag$_", port => $srv->{port},
                            %opt) } 1 .. 6;
    my @r = map { bg_wait($_) } @pids;
    return (\@r, (probe_count_in($probes, $tag))[1]);
}

sub check_shape {
    my ($name, $r, $max, $body_re) = @_;
    my @ok = grep { $_->{status} == 200 && $_->{body} =~ $body_re } @$r;
    ok t_cmp($max, 2, "$name: the backends counted at most (and at some point exactly) 2");
    ok t_cmp(scalar(@ok), 6, "$name: all 6 answered 200 with their whole body");
}

my $i = 0;
for my $s (@cgi_shapes) {
    my ($name, $path) = @$s;
    my ($r, $max) = six_at_once('cgi' . $i++, "/cgi/$path");
    check_shape("CGI, $name", $r, $max, qr/result=(?:admitted|queued)/);
}
{
    my ($r, $max) = six_at_once('gz', '/gz/probe.cgi?first=1',
                                headers => { 'Accept-Encoding' => 'gzip' });
    my $gz = grep { ($_->{headers}{'content-encoding'} // '') eq 'gzip' } @$r;
    check_shape("CGI, headers first, through mod_deflate ($gz gzipped)", $r, $max,
                $gz == 6 ? qr/./s : qr/^$/);
}
{
    my ($r, $max) = six_at_once('pt', '/pt/probe.cgi?first=1');
    check_shape('CGI, headers first, reached by a mod_rewrite [PT]', $r, $max,
                qr/result=(?:admitted|queued)/);
}
{
    open my $fh, '>', "$ssi/page.shtml" or die;
    print $fh "before\n<!--#include virtual=\"/cgi/probe.cgi?first=1&\$QUERY_STRING\" -->\nafter\n";
    close $fh;
    chmod 0644, "$ssi/page.shtml";
    my ($r, $max) = six_at_once('ssi', '/ssi/page.shtml');
    check_shape('CGI, headers first, as an SSI include (a subrequest of an unthrottled page)',
                $r, $max, qr/before\n.*result=(?:admitted|queued).*after/s);
}
{
    # A page in a zone of limit=1 includes a CGI of that zone: the include
    # runs under the page's slot, neither refused nor counted twice.
    open my $fh, '>', "$ssi/one.shtml" or die;
    print $fh "<!--#include virtual=\"/ssione/cgi/probe.cgi?tag=one\" -->\n";
    close $fh;
    chmod 0644, "$ssi/one.shtml";
    my $r = http_get('/ssione/one.shtml', port => $srv->{port});
    ok t_cmp("$r->{status} " . ($r->{body} =~ /(result=\S*)/ ? $1 : 'no include'),
             '200 result=admitted', 'an SSI include in a zone runs under its page\'s slot');
}
{
    my ($r, $max) = six_at_once('px', '/proxied/probe.cgi?first=1');
    check_shape('mod_proxy_http to a backend that streams while it works', $r, $max,
                qr/result=\s/);
}

# HTTP/2: six streams of one connection.
if (!$h2) {
    skip($no_h2) for 1 .. 2;
} else {
    my $client = Apache::Test::vars('serverroot') . '/bin/h2-get';
    my $paths = join ' ', map { "'/cgi/probe.cgi?first=1&tag=h2&sleep=1000&id=h$_'" } 1 .. 6;
    my @out = `/usr/bin/python3 $client 127.0.0.1 $srv->{port} $paths`;
    chomp @out;
    my $max = (probe_count_in($probes, 'h2'))[1];
    ok t_cmp($max, 2, 'HTTP/2 streams: the CGIs counted at most (and at some point exactly) 2');
    ok t_cmp(scalar(grep { /^200 [1-9]/ } @out), 6, "HTTP/2 streams: all 6 answered 200 (status and length: @out)");
}

# A WebSocket tunnel counts for its lifetime: while one is open, a second
# is refused (limit=1, queue=0); once it closes, the slot is free again.
sub upgrade {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $srv->{port},
                                  Timeout => 10) or die "connect: $!";
    print $s "GET /ws/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        . "Connection: Upgrade\r\n\r\n";
    my $line = <$s> // '';
    return ($s, ($line =~ m{^HTTP/\S+ (\d+)})[0] // 0);
}
my ($t1, $st1) = upgrade();
1 while defined($_ = <$t1>) && !/^\r?\n$/;
print $t1 "ping\n";
my $echo = <$t1> // '';
ok t_cmp("$st1 $echo", "101 ping\n", 'a WebSocket tunnel opens and carries data');
my ($t2, $st2) = upgrade();
close $t2;
ok t_cmp($st2, 503, 'a second tunnel is refused while the first is open (limit=1, queue=0)');
ok t_cmp(zone('ws', 'Active'), 1, 'the open tunnel holds the slot');
close $t1;
wait_until(sub { zone('ws', 'Active') == 0 }, 30);
my ($t3, $st3) = upgrade();
close $t3;
ok t_cmp($st3, 101, 'once the tunnel is closed, its slot is free again');

$srv->{stop}->();
$backend->{stop}->();
