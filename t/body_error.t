# A request whose body cannot be read before its zone decides (read_body=:
# the client closes short of its Content-Length, or sends a bad chunk)
# still has THROTTLE_RESULT set to a string, "body-failed": in its own
# log line, and in the environment of its ErrorDocument, which
# mod_include's printenv prints (a variable set to no string at all made
# the child crash there).
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Socket qw(SHUT_WR);

my $apxs = $ENV{APXS} || 'apxs';
chomp(my $moddir = `$apxs -q LIBEXECDIR`);
plan tests => 6,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
           mod_include => -f "$moddir/mod_include.so" };

my $pages = tempdir(CLEANUP => 1);
chmod 0755, $pages;
my $logs = tempdir(CLEANUP => 1);
open my $fh, '>', "$pages/env.shtml" or die;
print $fh "status 400 page\n<!--#printenv -->\n";
close $fh;
chmod 0644, "$pages/env.shtml";

my $srv = private_server(<<"CONF");
LoadModule include_module $moddir/mod_include.so
LogFormat "%r %>s result=%{THROTTLE_RESULT}e" result
CustomLog $logs/result_log result
ThrottleZone up limit=2 queue=4 timeout=5s read_body=1k
<Location /up/>
    Throttle up
    ErrorDocument 400 /pages/env.shtml
</Location>
Alias /pages/ "$pages/"
<Directory "$pages">
    Require all granted
    Options +Includes
    AddOutputFilter INCLUDES .shtml
</Directory>
CONF

# Sends $head and $body, closes its side, and returns the status and body
# of the answer (status 0: the connection closed without one).
sub send_and_close {
    my ($head, $body) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $srv->{port},
                                  Timeout => 10) or die "connect: $!";
    print $s "$head\r\nHost: 127.0.0.1\r\nConnection: close\r\n", $body;
    $s->flush;
    shutdown($s, SHUT_WR);
    local $/;
    my $raw = <$s> // '';
    my ($status) = $raw =~ m{^HTTP/\S+ (\d+)};
    my (undef, $answer) = split /\r\n\r\n/, $raw, 2;
    return ($status // 0, $answer // '');
}

my ($st, $page) = send_and_close("POST /up/short HTTP/1.1\r\nContent-Length: 100",
                                 "\r\n" . ('x' x 10));
ok t_cmp($st, 400, 'a body cut short of its Content-Length: 400');
ok t_cmp($page, qr/^THROTTLE_RESULT=body-failed$/m,
         'its error page prints THROTTLE_RESULT (printenv)');

($st, $page) = send_and_close("POST /up/badchunk HTTP/1.1\r\nTransfer-Encoding: chunked",
                              "\r\nzz\r\nxyz\r\n0\r\n\r\n");
ok t_cmp($st, 400, 'a bad chunk: 400');
ok t_cmp($page, qr/^THROTTLE_RESULT=body-failed$/m,
         'its error page prints THROTTLE_RESULT (printenv)');

$srv->{stop}->();
my $log = do { local (@ARGV, $/) = ("$logs/result_log"); -f $ARGV[0] ? <> : '' };
ok t_cmp($log, qr{^POST /up/short HTTP/1.1 400 result=body-failed$}m,
         'the access log shows the outcome');
my ($crash) = $srv->{log}->() =~ /^(.*(?:Segmentation fault|exit signal).*)$/m;
ok t_cmp($crash // 'none', 'none', 'no child crashed');
