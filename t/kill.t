# A child SIGKILLed while it holds a slot gives the slot back while its
# orphaned CGI still runs; one killed while waiting gives its queue place
# back while the request ahead of it still runs.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time sleep);

plan tests => 10, need_cgi;

probe_reset('killed');
my $victim = bg_get('/killed/probe.cgi?tag=killed&sleep=15000&id=victim');
wait_until(sub { (probe_count('killed'))[0] == 1 }) or die 'victim never started';
my ($row) = probe_order('killed');
my $cgi_pid = $row->[1];
# The process running the request (not the CGI's parent: under mod_cgid
# that is the cgid daemon).
my $httpd_pid = status_auto()->{'Throttle.killed.OldestRunningPid'};

ok t_cmp(http_get('/killed/probe.cgi?tag=k2')->{status}, 503, 'zone is full');
my $cmd = do { local (@ARGV, $/) = ("/proc/$httpd_pid/cmdline"); <> } // '';
ok t_cmp($httpd_pid != server_pid() && $cmd =~ /apache2|httpd/, 1,
         "slot held by httpd child $httpd_pid, not the parent");

# Back from the dead process, not when its CGI (15 s) ends: the CGI, out
# of httpd's reach, still runs when the slot is taken again.
kill 'KILL', $httpd_pid;
my $t0 = time;
my ($back, $cgi_alive);
while (time - $t0 < 12) {
    if (http_get('/killed/probe.cgi?tag=k2')->{status} == 200) {
        $back = time - $t0;
        $cgi_alive = kill 0, $cgi_pid;
        last;
    }
    sleep 0.05;
}
t_debug("slot came back after " . (defined $back ? sprintf('%.3f s', $back) : 'never'));
print STDERR sprintf("# kill.t: SIGKILLed holder's slot back after %s\n",
                     defined $back ? sprintf('%.3f s', $back) : 'never');
ok t_cmp(defined $back && $cgi_alive ? 1 : 0, 1,
         'slot back while the orphaned CGI still ran (' . (defined $back ? sprintf('%.3f s', $back) : 'never') . ')');
kill 'KILL', $cgi_pid; # the orphaned CGI would sleep on
bg_wait($victim);
my $s = status_auto();
ok t_cmp($s->{'Throttle.killed.Reclaimed'} >= 1, 1, 'counted as reclaimed');
ok t_cmp($s->{'Throttle.killed.Active'}, 0, 'nothing held any more');

# A child SIGKILLed while its request waits in the queue: the queue place
# comes back, the counts are exact, and the requests of other processes go
# on: the waiter behind it moves up and is served.
probe_reset('killq');
my $before = status_auto()->{'Throttle.killq.Reclaimed'};
my $holder = open_request('/killq/probe.cgi?tag=killq&sleep=60000&release=1&id=holder');
wait_until(sub { (probe_count('killq'))[0] == 1 }) or die 'holder never started';
my $w1 = open_request('/killq/probe.cgi?tag=killq&id=w1');
wait_until(sub { status_auto()->{'Throttle.killq.Queued'} == 1 }) or die 'w1 not queued';
my $w2 = open_request('/killq/probe.cgi?tag=killq&id=w2');
wait_until(sub { status_auto()->{'Throttle.killq.Queued'} == 2 }) or die 'w2 not queued';
my %pid_of = (holder => server_process_of($holder), w1 => server_process_of($w1),
              w2 => server_process_of($w2));
die 'cannot find the process of w1' unless $pid_of{w1};
kill 'KILL', $pid_of{w1};
$t0 = time;
my $placed = wait_until(sub { status_auto()->{'Throttle.killq.Queued'} <= 1 }, 30);
my $took = time - $t0;
# The holder runs on unless it shared the killed process (worker, event).
my $ahead = ($pid_of{holder} // 0) == $pid_of{w1} ? 1 : (probe_count('killq'))[0];
print STDERR sprintf("# kill.t: SIGKILLed waiter's queue place back after %.3f s\n", $took);
ok t_cmp($placed && $ahead == 1 ? 1 : 0, 1,
         sprintf('queue place back while the holder still ran (after %.3f s)', $took));
probe_release('killq');
# Under worker and event other requests may share the killed process: each
# of its records comes back.
my $in_victim = grep { ($pid_of{$_} // 0) == $pid_of{w1} } qw(holder w1 w2);
ok t_cmp(status_auto()->{'Throttle.killq.Reclaimed'} - $before, $in_victim,
         "the killed process's $in_victim record(s) reclaimed");

sub answer_of { my ($s) = @_; local $/; my $raw = <$s> // ''; ($raw =~ m{^HTTP/\S+ (\d+)})[0] // 0 }
my @others = grep { ($pid_of{$_} // 0) != $pid_of{w1} } qw(holder w2);
my %got = (holder => answer_of($holder), w2 => answer_of($w2));
# Under prefork every request has its own process; under worker and event
# all three may have shared the killed one, and then nothing is left to ask.
if (@others) {
    ok t_cmp(join(' ', map { "$_=$got{$_}" } @others), join(' ', map { "$_=200" } @others),
             'the requests of other processes were served (' . join(', ', @others) . ')')
        or print STDERR '# processes: ', join(', ', map { "$_=" . ($pid_of{$_} // '?') } sort keys %pid_of),
                        '; answers: ', join(', ', map { "$_=$got{$_}" } sort keys %got), "\n";
}
else {
    die 'under prefork the requests cannot share a process' if ($ENV{MPM} // '') eq 'prefork';
    ok t_cmp("holder=$got{holder} w2=$got{w2}", 'holder=0 w2=0',
             'all three were in the killed process: its requests died with it, unanswered');
}
my @ran = map { $_->[0] } probe_order('killq');
ok t_cmp(scalar(grep { $_ eq 'w1' } @ran), 0, "the killed waiter's CGI never ran");
my $s2 = status_auto();
ok t_cmp("$s2->{'Throttle.killq.Active'} $s2->{'Throttle.killq.Queued'}", '0 0',
         'counts back to exactly 0 running, 0 waiting');
