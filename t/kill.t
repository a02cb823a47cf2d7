# A child SIGKILLed while it holds a slot gives the slot back within 2 s.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time sleep);

plan tests => 5, need_cgi;

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

kill 'KILL', $httpd_pid;
my $t0 = time;
my $back;
while (time - $t0 < 5) {
    if (http_get('/killed/probe.cgi?tag=k2')->{status} == 200) {
        $back = time - $t0;
        last;
    }
    sleep 0.05;
}
t_debug("slot came back after " . (defined $back ? sprintf('%.3f s', $back) : 'never'));
print STDERR sprintf("# kill.t: SIGKILLed holder's slot back after %s\n",
                     defined $back ? sprintf('%.3f s', $back) : 'never');
ok t_cmp(defined $back && $back < 2, 1, 'slot back within 2 s');
kill 'KILL', $cgi_pid; # the orphaned CGI would sleep on
bg_wait($victim);
my $s = status_auto();
ok t_cmp($s->{'Throttle.killed.Reclaimed'} >= 1, 1, 'counted as reclaimed');
ok t_cmp($s->{'Throttle.killed.Active'}, 0, 'nothing held any more');
