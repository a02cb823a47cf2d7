# HTTP/2: a stream reset by its client (RST_STREAM) while its request waits
# in a zone's queue leaves the queue while the slot's holder still runs, and its handler never
# runs. (h2c with prior knowledge, from t/bin/h2-reset and python3-h2.)
# mod_http2 does not serve HTTP/2 under prefork: the test runs under worker
# and event.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use IPC::Open2;
use POSIX ();
use Time::HiRes qw(time sleep);

my $moddir = do { my $apxs = $ENV{APXS} || 'apxs'; my $d = `$apxs -q LIBEXECDIR`; chomp $d; $d };
my $client = Apache::Test::vars('serverroot') . '/bin/h2-reset';
plan tests => 4, need {
    'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
    'mod_http2' => -f "$moddir/mod_http2.so",
    'python3-h2 (apt-get install python3-h2)' =>
        system('/usr/bin/python3 -c "import h2" 2>/dev/null') == 0,
    'an MPM that serves HTTP/2 (not prefork)' => ($ENV{MPM} // '') ne 'prefork' };

my $cgi = Apache::Test::vars('serverroot') . '/cgi-bin';
my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $srv = private_server(<<"CONF", ready => '/ts?auto');
LoadModule http2_module $moddir/mod_http2.so
Protocols h2c http/1.1
H2Direct on
ThrottleZone h2z limit=1 queue=5 timeout=20s
SetEnv PROBE_DIR $probes
<Directory "$cgi">
    Options +ExecCGI
    Require all granted
</Directory>
ScriptAlias /h2z/ "$cgi/"
<Location /h2z/>
    Throttle h2z
</Location>
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
sub zone { zone_stat($srv, 'h2z', @_) }

my $holder = fork // die;
if (!$holder) {
    $srv->{get}->('/h2z/probe.cgi?tag=h2&id=hold&sleep=60000&release=1');
    POSIX::_exit(0);
}
wait_until(sub { zone('Active') == 1 }, 10) or die 'the holder never ran';

my $pid = open2(my $from, my $to, '/usr/bin/python3', $client, '127.0.0.1', $srv->{port},
                '/h2z/probe.cgi?tag=h2&id=reset');
my $line = <$from> // '';
my $queued = wait_until(sub { zone('Queued') == 1 }, 5);
ok t_cmp($queued, 1, 'the HTTP/2 request waits in the queue');
print $to "\n";
$line = <$from> // '';
# Promptly: while the holder (it runs until released) still has the slot,
# not when the slot would have come free.
my $t0 = time;
my $left = wait_until(sub { zone('Queued') == 0 }, 30);
my $took = time - $t0;
my $active = zone('Active');
print STDERR sprintf("# h2_reset.t: the reset stream left the queue after %.3f s\n", $took);
ok t_cmp($left && $active == 1 ? 1 : 0, 1,
         sprintf('the reset stream left the queue while the holder still ran (%.3f s)', $took));
probe_release('h2', $probes);
print $to "\n";
$line = <$from> // '';
waitpid($pid, 0);
waitpid($holder, 0);
sleep 0.5;
my @ran = do { open my $fh, '<', "$probes/h2.order" or die; map { (split)[0] } <$fh> };
ok t_cmp("@ran", 'hold', 'its handler never ran (only the holder did)');
ok t_cmp(zone('Aborted'), 1, 'counted as aborted');
$srv->{stop}->();
