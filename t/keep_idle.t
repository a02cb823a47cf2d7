# Worker threads kept free (ThrottleKeepIdleWorkers): a server of 50
# workers, a zone whose queue alone could take 100 of them (its third slot
# kept by reserve= for higher priorities, so that it never looks full to
# the requests of priority 0 that fill the other two), 60 clients on
# a CGI that sleeps 5 s, all at once (several reach one child within the
# same few milliseconds). By default the requests that would wait while
# fewer than 2 workers are idle get 503 at once (rejected-workers), and
# static files keep being served; with ThrottleKeepIdleWorkers 0 the
# waiters take every worker and static requests are not answered.
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

my $mpm = $ENV{MPM} // 'prefork';
plan tests => 5, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                        'a threaded MPM (50 workers as threads)' => $mpm ne 'prefork' };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;

sub server {
    my ($keep) = @_;
    return private_server(cgi_conf($probes) . <<"CONF");
StartServers 2
ServerLimit 2
ThreadsPerChild 25
MinSpareThreads 25
MaxSpareThreads 50
MaxRequestWorkers 50
KeepAlive Off
$keep
ThrottleZone heavy limit=3 reserve=1 queue=100 timeout=30s
<Location /cgi-bin/>
    Throttle heavy
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
}

# The status of a GET, or 0 when not answered within $secs.
sub get_within {
    my ($port, $path, $secs) = @_;
    my $st = 0;
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm $secs;
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die;
        print $s "GET $path HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        my $line = <$s> // '';
        $st = $line =~ m{^HTTP/\S+ (\d+)} ? $1 : 0;
        alarm 0;
    };
    alarm 0;
    return $st;
}

# 60 clients on the sleeping CGI, started together; a second later 10
# static requests, each given 3 s. Returns the static statuses and the
# zone's counters.
sub flood {
    my ($srv) = @_;
    my @pids;
    # each client waits for the pipe to close, so that all of them connect at once
    pipe(my $go_r, my $go_w) or die "pipe: $!";
    for my $i (1 .. 60) {
        my $pid = fork // die;
        if (!$pid) {
            close $go_w;
            sysread $go_r, my $byte, 1;
            get_within($srv->{port}, "/cgi-bin/probe.cgi?tag=k&sleep=5000", 30);
            POSIX::_exit(0);
        }
        push @pids, $pid;
    }
    close $go_r;
    close $go_w;
    sleep 1;
    my @static = map { get_within($srv->{port}, '/hello.txt', 3) } 1 .. 10;
    # What was running and waiting at its height, then the totals once the
    # clients have gone (their waiters leave the queue) and a worker is free.
    my $auto = get_within($srv->{port}, '/ts?auto', 3) ? $srv->{get}->('/ts?auto')->{body} : '';
    my %now = $auto =~ /^Throttle\.heavy\.(Active|Queued): (\d+)/mg;
    kill 'TERM', @pids;
    waitpid $_, 0 for @pids;
    wait_until(sub { get_within($srv->{port}, '/ts?auto', 2) == 200 }, 20) or die 'no status';
    my %c = $srv->{get}->('/ts?auto')->{body} =~ /^Throttle\.heavy\.(\w+): (\d+)/mg;
    # the counts at the height, or none if the status page went unanswered
    @c{qw(Active Queued)} = @now{qw(Active Queued)};
    return (\@static, \%c);
}

my $srv = server('');
my ($static, $c) = flood($srv);
my $ok = grep { $_ == 200 } @$static;
print STDERR "# keep_idle.t ($mpm): default: static 200s $ok of 10; zone: running ",
    $c->{Active} // 'unread', ', queued ', $c->{Queued} // 'unread', ',',
    " rejected-workers $c->{RejectedWorkers}, rejected-full $c->{RejectedFull}\n";
ok t_cmp($ok, 10, 'default: every static request is served while the zone floods');
ok t_cmp($c->{RejectedWorkers} > 0, 1, "the requests that would wait on the last workers "
         . "got 503 at once ($c->{RejectedWorkers})");
ok t_cmp(defined $c->{Queued} && defined $c->{Active} && $c->{Queued} + $c->{Active} <= 48, 1,
         sprintf('running + waiting at the height (%s + %s) left at least 2 of 50 workers',
                 $c->{Active} // 'unread', $c->{Queued} // 'unread'));
$srv->{stop}->();

$srv = server('ThrottleKeepIdleWorkers 0');
($static, $c) = flood($srv);
$ok = grep { $_ == 200 } @$static;
print STDERR "# keep_idle.t ($mpm): ThrottleKeepIdleWorkers 0: static 200s $ok of 10\n";
ok t_cmp($ok < 10, 1, "with the check off the waiters take the workers: $ok of 10 static answered");
ok t_cmp("$c->{RejectedWorkers} $c->{QueuedTotal}" =~ /^0 (\d+)$/ && $1 >= 40, 1,
         "and nothing is refused for workers: all of them queued ($c->{QueuedTotal})");
$srv->{stop}->();
