# A refusal keeps its keep-alive connection where HTTP allows: the
# module's 503 and 429 (Retry-After and all, and through a local
# ErrorDocument) leave an HTTP/1.1 connection open, and the client's next
# request is answered on it. Closed as httpd closes it: when the client
# asks (Connection: close), over HTTP/1.0, and when a request body was
# left unread.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use IO::Select;
use IO::Socket::INET;

plan tests => 11, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $docs = tempdir(CLEANUP => 1);
chmod 0755, $docs;
open my $fh, '>', "$docs/busy.html" or die;
print $fh "<p>busy, come back soon</p>\n";
close $fh;
open $fh, '>', "$docs/busy.shtml" or die;
print $fh "busy<!--#include virtual=\"/inc/probe.cgi?tag=inc\" -->\n";
close $fh;
chmod 0644, "$docs/busy.html", "$docs/busy.shtml";
my $apxs = $ENV{APXS} || 'apxs';
chomp(my $moddir = `$apxs -q LIBEXECDIR`);
my $srv = private_server(cgi_conf($probes, '/full/', '/many/', '/page/', '/ssi/', '/inc/')
                         . <<"CONF");
LoadModule include_module $moddir/mod_include.so
KeepAlive On
MaxKeepAliveRequests 100
ThrottleZone full limit=1 queue=0
ThrottleZone many limit=1 queue=0 status=429
ThrottleZone page limit=1 queue=0
ThrottleZone ssi limit=1 queue=0
ThrottleZone inc limit=1 queue=5 timeout=60s
<Location /ssi/>
    Throttle ssi
    ErrorDocument 503 /docs/busy.shtml
</Location>
<Location /inc/>
    Throttle inc
</Location>
<Location /full/>
    Throttle full
</Location>
<Location /many/>
    Throttle many
</Location>
<Location /page/>
    Throttle page
    ErrorDocument 503 /docs/busy.html
</Location>
Alias /docs/ "$docs/"
<Directory "$docs">
    Options +Includes
    AddOutputFilter INCLUDES .shtml
    Require all granted
</Directory>
CONF

# Requests in turn on one connection; returns each answer's status line,
# headers and body, and whether the server closed the connection after
# the last one.
sub on_one_connection {
    my (@reqs) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $srv->{port},
                                  Timeout => 20) or die "connect: $!";
    my (@answers, $buf);
    $buf = '';
    my $sel = IO::Select->new($s);
    for my $req (@reqs) {
        print $s $req;
        my ($head, $body);
        while (1) {
            if ($buf =~ /\A(.*?\r\n\r\n)/s) {
                $head = $1;
                my ($len) = $req =~ /^HEAD / ? (0) : $head =~ /^Content-Length: (\d+)\r$/mi;
                if (defined $len && length($buf) >= length($head) + $len) {
                    $body = substr($buf, length($head), $len);
                    $buf = substr($buf, length($head) + $len);
                    last;
                }
            }
            last unless $sel->can_read(20) && sysread($s, $buf, 65536, length $buf);
        }
        push @answers, { head => $head // '', body => $body // '' };
        last unless defined $body;
    }
    my $closed = !$sel->can_read(2) ? 0 : !sysread($s, $buf, 1);
    close $s;
    return (\@answers, $closed);
}

sub get11 { my ($path, $extra) = @_; "GET $path HTTP/1.1\r\nHost: 127.0.0.1\r\n" . ($extra // '') . "\r\n" }
sub status_of { ($_[0]{head} =~ m{^HTTP/\S+ (\d+)})[0] // 0 }

# Each zone's one slot held by a sleeping CGI.
my @holds = map { bg_get("/$_/probe.cgi?tag=$_&sleep=60000&release=1", port => $srv->{port}) }
            qw(full many page ssi);
wait_until(sub { (grep { (probe_count_in($probes, $_))[0] == 1 } qw(full many page ssi)) == 4 }, 10)
    or die 'holders never ran';

my ($a, $closed) = on_one_connection(get11('/full/probe.cgi?tag=x'), get11('/full/probe.cgi?tag=x'),
                                     get11('/hello.txt'));
ok t_cmp(join(' ', map { status_of($_) } @$a), '503 503 200',
         'two refusals and a file answered on one HTTP/1.1 connection');
ok t_cmp(($a->[0]{head} =~ /^Retry-After: (\d+)\r$/m ? 'Retry-After' : 'none')
         . ($a->[0]{head} =~ /^Connection: close/mi ? ' close' : ''), 'Retry-After',
         'the 503 carries Retry-After and no Connection: close');
ok t_cmp($closed, 0, 'the connection stays open after them');

# httpd itself never closes after a 429 (ap_status_drops_connection names
# 503, not 429): what the module owes a 429 is to leave its connection
# alone, as a client sees it: no Connection: close in any answer, and open
# after them.
($a, $closed) = on_one_connection(get11('/many/probe.cgi?tag=x'), get11('/many/probe.cgi?tag=x'),
                                  get11('/hello.txt'));
ok t_cmp(join(' ', map { status_of($_) } @$a)
         . ($a->[0]{head} =~ /^Retry-After: \d+\r$/m ? ' Retry-After' : '')
         . ((grep { $_->{head} =~ /^Connection: close/mi } @$a) ? ' close' : '')
         . " closed=$closed", '429 429 200 Retry-After closed=0',
         'status=429: the same (Retry-After, no Connection: close, open after)');

($a) = on_one_connection(get11('/page/probe.cgi?tag=x'), get11('/page/probe.cgi?tag=x'));
ok t_cmp(join(' ', map { status_of($_) . ' ' . $_->{body} } @$a),
         "503 <p>busy, come back soon</p>\n 503 <p>busy, come back soon</p>\n",
         'a local ErrorDocument 503 is shown, and the connection kept');

($a, $closed) = on_one_connection(get11('/full/probe.cgi?tag=x', "Connection: close\r\n"));
ok t_cmp(status_of($a->[0]) . " $closed", '503 1', 'the client asked for close: closed');

($a, $closed) = on_one_connection("GET /full/probe.cgi?tag=x HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
ok t_cmp(status_of($a->[0]) . " $closed", '503 1', 'HTTP/1.0: closed');

($a, $closed) = on_one_connection("POST /full/probe.cgi?tag=x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  . "Content-Length: 5\r\n\r\nhello");
ok t_cmp(status_of($a->[0]) . ' ' . ($a->[0]{head} =~ /^Connection: close/mi ? 'close' : 'kept')
         . " $closed", '503 close 1', 'a request body left unread: closed');

($a, $closed) = on_one_connection("HEAD /full/probe.cgi?tag=x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                                  get11('/hello.txt'));
ok t_cmp(join(' ', map { status_of($_) } @$a) . " $closed", '503 200 0',
         'HEAD: refused, and the next request answered on the same connection');

# An error page is never left waiting: its SSI include of a CGI in a full
# zone (its slot held until released, a queue to wait in) is refused at
# once, while the holder still runs.
my $inc = bg_get('/inc/probe.cgi?tag=inc&release=1&sleep=60000', port => $srv->{port});
wait_until(sub { (probe_count_in($probes, 'inc'))[0] == 1 }, 10) or die 'inc holder never ran';
my $r = http_get('/ssi/probe.cgi?tag=x', port => $srv->{port}, timeout => 30);
my $still = (probe_count_in($probes, 'inc'))[0];
probe_release('inc', $probes);
bg_wait($inc);
ok t_cmp("$r->{status} $still " . ($r->{body} =~ /^busy/ ? 'page' : 'no page'), '503 1 page',
         'the error page ran, its include refused at once while the zone was full');

probe_release($_, $probes) for qw(full many page ssi);
bg_wait($_) for @holds;
($a) = on_one_connection(get11('/full/probe.cgi?tag=x'));
ok t_cmp(status_of($a->[0]), 200, 'once free, the zone runs the request');
$srv->{stop}->();
