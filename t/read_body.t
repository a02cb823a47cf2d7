# read_body=1k (zone body, limit=2): a request's body, up to 1 KiB, is read
# before the request takes a slot. Two clients trickling their bodies do not
# hold the zone's two slots while they trickle; every body reaches the CGI
# byte for byte, whatever its size or framing. A request the zone refuses
# at once is not asked for its body: no 100 Continue, no upload.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Digest::MD5 qw(md5_hex);
use IO::Select;
use File::Temp qw(tempdir);
use Time::HiRes qw(time sleep);

plan tests => 13, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

# POST $body to $path on a connection of our own; with chunked, in chunks of
# 700 bytes. Returns the answer's status and body.
sub post {
    my ($path, $body, %opt) = @_;
    my $sock = ThrottleT::connect_server();
    my $head = "POST $path HTTP/1.1\r\nHost: " . hostport() . "\r\nConnection: close\r\n"
             . "Content-Type: application/octet-stream\r\n";
    if ($opt{chunked}) {
        print $sock $head, "Transfer-Encoding: chunked\r\n\r\n";
        for (my $i = 0; $i < length $body; $i += 700) {
            my $c = substr($body, $i, 700);
            printf $sock "%x\r\n%s\r\n", length $c, $c;
        }
        print $sock "0\r\n\r\n";
    }
    else {
        print $sock $head, 'Content-Length: ' . length($body) . "\r\n\r\n", $body;
    }
    local $/;
    my $raw = <$sock> // '';
    my ($status) = $raw =~ m{^HTTP/\S+ (\d+)};
    my (undef, $answer) = split /\r\n\r\n/, $raw, 2;
    $answer //= '';
    $answer =~ s/^[0-9a-f]+\r\n(.*?)\r\n0\r\n\r\n\z/$1/s; # a chunked answer
    return ($status // 0, $answer);
}

# Bodies of every size around the limit reach the CGI unchanged.
my $n = 0;
for my $case ([small => 10], [exactly => 1024], [one_more => 1025], [empty => 0],
              [larger => 100_000]) {
    my ($name, $len) = @$case;
    my $body = join '', map { chr(($_ * 7 + $n++) % 256) } 1 .. $len;
    my ($st, $got) = post('/body/echo.cgi', $body);
    ok t_cmp("$st $got", qr/^200 len=$len md5=${\ md5_hex($body)} /,
             "a body of $len bytes ($name) arrives byte for byte");
}
my $chunked = join '', map { chr($_ % 251) } 1 .. 3000;
my ($st, $got) = post('/body/echo.cgi', $chunked, chunked => 1);
ok t_cmp("$st $got", qr/^200 len=3000 md5=${\ md5_hex($chunked)} /,
         'a chunked body of 3000 bytes arrives byte for byte');
$chunked = 'x' x 500;
($st, $got) = post('/body/echo.cgi', $chunked, chunked => 1);
ok t_cmp("$st $got", qr/^200 len=500 md5=${\ md5_hex($chunked)} /,
         'a chunked body under the limit arrives byte for byte');

# Two clients trickle 600-byte bodies over 4 s; the zone has 2 slots. Four
# other requests of the zone, sent meanwhile, must be answered while the
# trickling goes on.
probe_reset('fast');
my $t0 = time;
my @tricklers;
for my $k (1 .. 2) {
    my $pid = fork // die;
    if (!$pid) {
        my $sock = ThrottleT::connect_server();
        print $sock "POST /body/echo.cgi HTTP/1.1\r\nHost: " . hostport()
            . "\r\nConnection: close\r\nContent-Length: 600\r\n\r\n";
        $sock->autoflush(1);
        for my $i (1 .. 20) {
            print $sock 'y' x 30;
            sleep 0.2;
        }
        local $/;
        my $raw = <$sock> // '';
        require POSIX;
        POSIX::_exit($raw =~ m{^HTTP/\S+ 200} && $raw =~ /len=600 / ? 0 : 1);
    }
    push @tricklers, $pid;
}
sleep 0.5;
my @fast = map { bg_get("/body/probe.cgi?tag=fast&id=f$_") } 1 .. 4;
my @res = map { bg_wait($_) } @fast;
my $fast_done = time - $t0;
my $ok_tricklers = 0;
for (@tricklers) {
    waitpid($_, 0);
    $ok_tricklers++ if $? == 0;
}
my $trickle_done = time - $t0;
print STDERR sprintf("# read_body.t: 4 other requests done %.2f s after the tricklers "
                     . "began; the tricklers finished after %.2f s\n", $fast_done, $trickle_done);
ok t_cmp(join(' ', map { $_->{status} } @res), '200 200 200 200', 'the other requests ran');
ok t_cmp($fast_done < $trickle_done - 1, 1,
         sprintf('they were not held behind the tricklers (%.2f s; trickling took %.2f s)',
                 $fast_done, $trickle_done));
ok t_cmp($ok_tricklers, 2, 'the trickled bodies arrived whole');

# A full zone (limit=1, queue=0, its slot held): a POST that expects
# 100 Continue is answered 503 at once, without the 100 that would ask for
# its 200 KB, and the connection closes (the body is still unsent).
{
    my $probes = tempdir(CLEANUP => 1);
    chmod 0777, $probes;
    my $srv = private_server(cgi_conf($probes) . <<'CONF');
ThrottleZone full limit=1 queue=0
<Location /cgi-bin/>
    Throttle full
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
    my $hold = bg_get('/cgi-bin/probe.cgi?tag=full&sleep=3000', port => $srv->{port});
    wait_until(sub { (probe_count_in($probes, 'full'))[0] == 1 }, 10) or die 'never ran';
    my $sock = ThrottleT::connect_server(port => $srv->{port});
    print $sock "POST /cgi-bin/echo.cgi HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        . "Content-Length: 200000\r\nExpect: 100-continue\r\n\r\n";
    my $raw = '';
    my $sel = IO::Select->new($sock);
    while ($sel->can_read(20)) {
        last unless sysread($sock, $raw, 65536, length $raw);
    }
    close $sock;
    my ($first) = $raw =~ m{^(HTTP/\S+ \d+)};
    ok t_cmp($first // 'no answer', 'HTTP/1.1 503',
             'a refused POST gets 503 as its first answer, no 100 Continue');
    ok t_cmp($raw, qr/^Connection: close\r$/mi, 'and the connection closes');
    bg_wait($hold);
    my $st = $srv->{get}->('/ts?auto')->{body};
    ok t_cmp(($st =~ /^Throttle\.full\.RejectedFull: (\d+)/m)[0], 1, 'counted as rejected-full');
    $srv->{stop}->();
}
