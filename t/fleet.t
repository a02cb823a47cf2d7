# A real HAProxy (Debian's haproxy) in front of two private httpds, fed by
# ThrottleAgent: a host whose zone fills up has its weight (and its
# maxconn, the zone's limit) in HAProxy within a few agent intervals, read
# from HAProxy's own stats socket; a refusal with 429 reaches the client
# with its Retry-After and leaves the host UP under "observe layer7", where
# the same refusal with 503 marks the host DOWN; and a graceful stop of one host while clients keep
# coming through HAProxy fails no request.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use IO::Socket::UNIX;
use POSIX ();
use Storable qw(store retrieve);
use Time::HiRes qw(time sleep);

my $haproxy = (grep { -x } map { "$_/haproxy" } split(/:/, $ENV{PATH}), '/usr/sbin')[0];
plan tests => 8, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                        'haproxy (scripts/setup installs it)' => $haproxy };

my $inter = 1; # agent-inter, seconds
my $work = tempdir(CLEANUP => 1);
chmod 0755, $work;

sub host {
    my ($name) = @_;
    my $probes = "$work/$name";
    mkdir $probes;
    chmod 0777, $probes;
    my $aport = free_port();
    my $srv = private_server(cgi_conf($probes, '/cgi-bin/', '/c429/', '/c503/')
                             . agent_conf($aport, 'fz') . <<"CONF");
ThrottleZone fz limit=2 queue=10 timeout=30s
ThrottleZone z429 limit=1 queue=0 status=429 retry_after=5
ThrottleZone z503 limit=1 queue=0 retry_after=5
<Location /c429/>
    Throttle z429
</Location>
<Location /c503/>
    Throttle z503
</Location>
<Location /cgi-bin/>
    Throttle fz
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
    $srv->{aport} = $aport;
    $srv->{probes} = $probes;
    return $srv;
}

my @h = (host('h1'), host('h2'));
my $fport = free_port();
open my $fh, '>', "$work/haproxy.cfg" or die;
print $fh <<"CFG";
global
    stats socket $work/admin.sock mode 600 level admin
    pidfile $work/haproxy.pid
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout queue 30s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response
    option http-server-close
frontend fe
    bind 127.0.0.1:$fport
    use_backend l7_429 if { path_beg /c429/ }
    use_backend l7_503 if { path_beg /c503/ }
    default_backend be
backend l7_429
    server h1 127.0.0.1:$h[0]{port} check inter 10s observe layer7 error-limit 1 on-error mark-down
backend l7_503
    server h1 127.0.0.1:$h[0]{port} check inter 10s observe layer7 error-limit 1 on-error mark-down
backend be
    balance leastconn
    server h1 127.0.0.1:$h[0]{port} weight 100 maxconn 100 check inter 500ms agent-check agent-port $h[0]{aport} agent-inter ${inter}s observe layer4 error-limit 1 on-error mark-down
    server h2 127.0.0.1:$h[1]{port} weight 100 maxconn 100 check inter 500ms agent-check agent-port $h[1]{aport} agent-inter ${inter}s observe layer4 error-limit 1 on-error mark-down
CFG
close $fh;
system($haproxy, '-f', "$work/haproxy.cfg", '-D') == 0 or die 'haproxy did not start';
wait_until(sub { -s "$work/haproxy.pid" }, 10) or die 'no haproxy pid';
my $hapid = do { local (@ARGV, $/) = ("$work/haproxy.pid"); <> =~ /(\d+)/; $1 };
my $owner = $$;
END { kill 'TERM', $hapid if $hapid && $$ == $owner && kill 0, $hapid }

# A column of HAProxy's "show stat" for server $srv of backend $be.
sub stat_in {
    my ($be, $srv, $col) = @_;
    my $s = IO::Socket::UNIX->new(Peer => "$work/admin.sock") or return '';
    print $s "show stat\n";
    my @lines = <$s>;
    my @cols = split /,/, ((shift @lines) // '') =~ s/^# //r;
    for (@lines) {
        my %v;
        @v{@cols} = split /,/;
        return $v{$col} // '' if ($v{pxname} // '') eq $be && ($v{svname} // '') eq $srv;
    }
    return '';
}
sub stat_of { my ($srv, $col) = @_; stat_in('be', $srv, $col) }

ok t_cmp(wait_until(sub { stat_of('h1', 'slim') eq '2' && stat_of('h2', 'slim') eq '2' }, 10),
         1, 'the agent set maxconn to the zones\' limit (2) on both servers');

# Fill h1's zone directly: 2 running, 6 of 10 waiting -> weight 40 %.
my @holders;
for (1 .. 8) {
    my $pid = fork // die;
    if (!$pid) { $h[0]{get}->('/cgi-bin/probe.cgi?tag=hold&sleep=60000&release=1'); POSIX::_exit(0) }
    push @holders, $pid;
}
wait_until(sub { $h[0]{get}->('/ts?auto')->{body} =~ /^Throttle\.fz\.Queued: 6$/m }, 10)
    or die 'h1 did not fill';
# The holders run until released: the weight follows the queue both ways,
# however slowly a loaded machine runs the agent checks (how fast is a
# speed figure, printed, not asserted).
my $t0 = time;
my $seen = wait_until(sub { stat_of('h1', 'weight') eq '40' }, 10 * $inter);
my $took = time - $t0;
print STDERR sprintf("# fleet.t: h1's weight 40 in HAProxy %.2f s after its queue filled\n", $took);
ok t_cmp($seen, 1, sprintf('a filling queue lowers the host\'s weight in HAProxy (100 -> 40) '
                           . '(%.2f s; agent-inter %d s)', $took, $inter));
ok t_cmp(stat_of('h2', 'weight'), 100, 'the idle host keeps its weight');
probe_release('hold', $h[0]{probes});
waitpid $_, 0 for @holders;
# h1 idle again, and HAProxy told so, before the traffic starts.
wait_until(sub { $h[0]{get}->('/ts?auto')->{body} =~ /^Throttle\.fz\.Active: 0$/m }, 10);
ok t_cmp(wait_until(sub { stat_of('h1', 'weight') eq '100' }, 10 * $inter), 1,
         'and back to 100 once it emptied');

# 429 against 503 under "observe layer7": h1's slot of each zone held,
# one more request of each through HAProxy.
sub through_haproxy {
    my ($path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $fport, Timeout => 10)
        or return '';
    print $s "GET $path HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    local $/;
    return <$s> // '';
}
my %verdict;
for my $st (429, 503) {
    my $holder = fork // die;
    if (!$holder) { $h[0]{get}->("/c$st/probe.cgi?tag=hold$st&sleep=3000"); POSIX::_exit(0) }
    wait_until(sub { $h[0]{get}->('/ts?auto')->{body} =~ /^Throttle\.z$st\.Active: 1$/m }, 10);
    my $raw = through_haproxy("/c$st/probe.cgi?tag=r$st");
    my ($code) = $raw =~ m{^HTTP/\S+ (\d+)};
    my ($ra) = $raw =~ /^Retry-After:\s*(\d+)/mi;
    sleep 0.5;
    $verdict{$st} = sprintf '%s Retry-After=%s h1 %s', $code // 0, $ra // '-',
                            stat_in("l7_$st", 'h1', 'status');
    waitpid $holder, 0;
}
print STDERR "# fleet.t: observe layer7: status=429 -> $verdict{429}; 503 -> $verdict{503}\n";
ok t_cmp($verdict{429}, qr/^429 Retry-After=5 h1 UP/, 'status=429 reaches the client through HAProxy'
         . ' with Retry-After, and HAProxy keeps the host UP');
ok t_cmp($verdict{503}, qr/^503 Retry-After=5 h1 DOWN/,
         'the same refusal as 503 marks the correctly shedding host DOWN (the trap 429 avoids)');

# Clients through HAProxy; h1 told to stop gracefully two seconds in.
my $clients = 4;
my $secs = 7;
my @pids;
for my $c (1 .. $clients) {
    my $pid = fork // die;
    if (!$pid) {
        my @st;
        my $end = time + $secs;
        while (time < $end) {
            my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $fport,
                                          Timeout => 30);
            my $raw = '';
            if ($s) {
                print $s "GET /cgi-bin/probe.cgi?tag=fleet&sleep=150 HTTP/1.0\r\n"
                       . "Host: 127.0.0.1\r\n\r\n";
                local $/;
                $raw = <$s> // '';
            }
            push @st, $raw =~ m{^HTTP/\S+ (\d+)} ? $1 : 0;
            if ($st[-1] != 200 && !-e "$work/failed.$$") {
                open my $o, '>', "$work/failed.$$" or die;
                print $o $raw;
            }
        }
        store(\@st, "$work/client.$$");
        POSIX::_exit(0);
    }
    push @pids, $pid;
}
sleep 2;
my $served = sub { my $f = "$_[0]{probes}/fleet.order"; -f $f ? scalar(() = do { open my $o, '<', $f; <$o> }) : 0 };
my $served_before = $served->($h[0]);
kill 'WINCH', $h[0]{pid}; # httpd -k graceful-stop
my $stopped = wait_until(sub { !kill 0, $h[0]{pid} }, 20);
sleep 1;
for my $sv (qw(h1 h2)) { print STDERR "# fleet.t: after the stop, HAProxy: $sv ", join(' ', map { "$_=" . stat_of($sv, $_) } qw(status weight slim scur qcur agent_status last_agt check_status last_chk)), "\n"; }
my @all;
for (@pids) {
    waitpid $_, 0;
    push @all, @{ retrieve("$work/client.$_") };
}
my %n;
$n{$_}++ for @all;
print STDERR sprintf("# fleet.t: through HAProxy during h1's graceful stop: %s; "
                     . "h1 served %d (%d before the stop), h2 %d\n",
                     join(', ', map { "$_: $n{$_}" } sort keys %n),
                     $served->($h[0]), $served_before, $served->($h[1]));
ok t_cmp($served_before > 0 && $stopped, 1,
         "h1 was serving ($served_before requests) when told to stop, and stopped");
for my $f (glob "$work/failed.*") {
    open my $i, '<', $f or next;
    print STDERR "# fleet.t: a failed answer: ", join('# ', <$i>), "\n";
    last;
}
ok t_cmp(join(' ', sort keys %n), '200', 'no request through HAProxy failed ('
         . scalar(@all) . ' requests)');

kill 'USR1', $hapid; # haproxy's soft stop
wait_until(sub { !kill 0, $hapid }, 10) or kill 'KILL', $hapid;
$h[1]{stop}->();
