# What a load balancer is told, from outside the module:
#   - status=429: a refused request gets 429 with Retry-After, and the CGIs
#     never see more than the limit at once;
#   - ThrottleAgent: connections to the agent's address get one line that
#     parses under HAProxy's agent-check grammar, with maxconn = the limit,
#     a weight that falls as the queue fills, and drain while the drain
#     file exists; garbage, a long line or a silent peer get the line or a
#     close, never a hang;
#   - throttle-health: 200 while the zone is full (busy is not sick), 503
#     while draining; it and the status page are never throttled, even
#     under a Throttle that covers them;
#   - a held zone lock delays neither the agent nor the health endpoint.
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

plan tests => 18, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $drain = "$probes/drain";

# The agent's line (or '' on a close), what was sent first, and how long it took.
sub agent_line {
    my ($port, %opt) = @_;
    my $t0 = time;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 5)
        or return ('', time - $t0);
    $s->autoflush(1);
    if (defined $opt{send}) {
        local $SIG{PIPE} = 'IGNORE';
        print $s $opt{send};
    }
    sleep $opt{silent_for} if $opt{silent_for};
    my $line = '';
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm 10;
        $line = <$s> // '';
        alarm 0;
    };
    alarm 0;
    return ($line, time - $t0);
}

# HAProxy's agent-check grammar (doc/configuration.txt): words separated by
# spaces, tabs or commas up to the first CR or LF. Returns the facts, or
# { error => why }.
sub parse_agent {
    my ($line) = @_;
    return { error => 'no line' } unless $line =~ /\A([^\r\n]*)\r?\n\z/;
    my %r;
    my @w = split /[ \t,]+/, $1;
    while (defined(my $w = shift @w)) {
        next if $w eq '';
        if ($w =~ /^(\d+)%$/) { $r{weight} = $1 }
        elsif ($w =~ /^maxconn:(\d+)$/) { $r{maxconn} = $1 }
        elsif ($w =~ /^(ready|drain|maint)$/) { $r{admin} = $1 }
        elsif ($w eq 'up') { $r{up} = 1 }
        elsif ($w =~ /^(down|fail|stopped)$/) { $r{up} = 0; last }
        else { return { error => "'$w' is not an agent-check word" } }
    }
    return \%r;
}

sub facts { my $f = parse_agent($_[0]); join ' ', map { "$_=$f->{$_}" } sort keys %$f }

my $aport = free_port();
my $srv = private_server(cgi_conf($probes, '/cgi-bin/', '/c429/') . agent_conf($aport, 'lbz') . <<"CONF");
ThrottleZone lbz limit=2 queue=4 timeout=20s
ThrottleZone lb429 limit=1 queue=0 status=429 retry_after=3
ThrottleDrainFile $drain
<Location />
    Throttle lbz
</Location>
<Location /c429/>
    Throttle lb429
</Location>
<Location /health>
    SetHandler throttle-health
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
my $get = $srv->{get};
sub header { my ($r, $h) = @_; $r->{raw} =~ /^\Q$h\E:\s*(\S+)/mi ? $1 : '' }

# ---- status=429 -----------------------------------------------------------
my $hold = fork // die;
if (!$hold) { $get->('/c429/probe.cgi?tag=c429&sleep=2500'); POSIX::_exit(0) }
wait_until(sub { (probe_count_in($probes, 'c429'))[0] == 1 }, 10);
my $r = $get->('/c429/probe.cgi?tag=c429');
ok t_cmp("$r->{status} Retry-After=" . header($r, 'Retry-After'), '429 Retry-After=3',
         'status=429: a refused request gets 429 and Retry-After');
waitpid $hold, 0;
ok t_cmp((probe_count_in($probes, 'c429'))[1], 1, 'the CGIs never saw 2 at once');
ok t_cmp($get->('/c429/probe.cgi?tag=c429')->{status}, 200, 'served again once the slot is free');

# ---- the agent, idle ------------------------------------------------------
my ($line, $secs) = agent_line($aport);
ok t_cmp(facts($line), 'admin=ready maxconn=2 up=1 weight=100',
         "idle zone: '" . ($line =~ s/\n//r) . "'");
# HAProxy asks every agent-inter (2 s by default) and gives up after its
# check timeout: an agent that waits on anything is a failed check.
ok t_cmp($secs < 2 ? 1 : 0, 1, sprintf("the agent answered within HAProxy's default "
                                       . 'agent-inter of 2 s (%.3f s)', $secs));

# ---- full: 2 running, 4 waiting -----------------------------------------
my @pids;
for my $i (1 .. 6) {
    my $pid = fork // die;
    if (!$pid) { $get->("/cgi-bin/probe.cgi?tag=lbz&sleep=6000"); POSIX::_exit(0) }
    push @pids, $pid;
    # in order, so that the 2 running ones come first
    wait_until(sub { (status_of('Queued') + status_of('Active')) >= $i }, 10);
}
sub status_of {
    my ($k) = @_;
    my $b = $get->('/ts?auto')->{body};
    return $b =~ /^Throttle\.lbz\.\Q$k\E: (\d+)/m ? $1 : -1;
}
($line) = agent_line($aport);
ok t_cmp(facts($line), 'admin=ready maxconn=2 up=1 weight=1',
         'a full queue: the weight falls to 1 %, maxconn stays the limit');
my $h = $get->('/health');
ok t_cmp($h->{status}, 200, 'throttle-health: 200 while the zone is full (busy is not sick)');
ok t_cmp($h->{body}, qr/^lbz: up ready 1% maxconn:2$/m, 'its body carries the agent line');
ok t_cmp($get->('/ts?auto')->{status}, 200, 'the status page is not throttled either');
ok t_cmp($get->('/cgi-bin/probe.cgi?tag=lbz')->{status}, 503,
         'while a request of the zone is refused');

# ---- bad input on the agent's port ---------------------------------------
($line) = agent_line($aport, send => "GET / HTTP/1.0\r\n\r\n");
ok t_cmp(parse_agent($line)->{maxconn}, 2, 'an HTTP request on the agent port gets the agent line');
($line, $secs) = agent_line($aport, send => ('x' x 200_000));
ok t_cmp((($line eq '' || (parse_agent($line)->{maxconn} // 0) == 2) && $secs < 10)
         ? 'line or close' : "'$line' after $secs s", 'line or close',
         "a 200 kB line: the agent line or a close, after ${secs} s");
($line, $secs) = agent_line($aport, silent_for => 1);
ok t_cmp(parse_agent($line)->{up}, 1, 'a silent peer gets its line all the same');

# ---- drain ----------------------------------------------------------------
open my $fh, '>', $drain or die;
close $fh;
($line) = agent_line($aport);
ok t_cmp(parse_agent($line)->{admin}, 'drain', 'drain file present: the agent says drain');
$h = $get->('/health');
ok t_cmp("$h->{status} " . ($h->{body} =~ /^lbz: (\S+ \S+)/m ? $1 : ''), '503 up drain',
         'and throttle-health answers 503');
unlink $drain;
($line) = agent_line($aport);
ok t_cmp(parse_agent($line)->{admin}, 'ready', 'drain file gone: ready again');
kill 'TERM', @pids;
waitpid $_, 0 for @pids;
$srv->{stop}->();

# ---- a held lock delays neither -----------------------------------------
my $spool = tempdir(CLEANUP => 1);
chmod 0777, $spool;
$aport = free_port();
local $ENV{MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER} = "$spool/holder.pid";
my $lk = private_server(agent_conf($aport, 'lk') . <<"CONF", ready => '/health');
ThrottleZone lk limit=3 queue=5
<Location /zoned.txt>
    Throttle lk
</Location>
<Location /health>
    SetHandler throttle-health
</Location>
CONF
open $fh, '>', "$lk->{dir}/zoned.txt" or die;
print $fh "zoned\n";
close $fh;
chmod 0644, "$lk->{dir}/zoned.txt";
my $hanger = fork // die;
if (!$hanger) { $lk->{get}->('/zoned.txt'); POSIX::_exit(0) }
wait_until(sub { -s "$spool/holder.pid" }, 10) or die 'no lock holder';
($line, $secs) = agent_line($aport);
ok t_cmp(facts($line), 'admin=ready maxconn=3 up=1 weight=100',
         "lock held: the agent still answers (in ${secs} s)");
my $t0 = time;
$h = $lk->{get}->('/health');
ok t_cmp($h->{status}, 200, sprintf('and so does throttle-health (in %.3f s)', time - $t0));
my $holder = do { local (@ARGV, $/) = ("$spool/holder.pid"); <> };
kill 'KILL', $holder =~ /(\d+)/ ? $1 : ();
kill 'TERM', $hanger;
waitpid $hanger, 0;
$lk->{stop}->();
