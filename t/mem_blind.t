# mem= in a container whose memory cgroup cannot be read: the readings fall
# back on the machine's MemAvailable, which may be far more than the cgroup
# allows. The server says so once, at startup; the status page names where
# its reading comes from (a word: cgroup2, cgroup1, meminfo).
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use File::Path qw(make_path);

plan tests => 5, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

# The process sits in cgroup /box, whose files are not there to read.
my $root = tempdir(CLEANUP => 1);
make_path("$root/proc/self");
open my $fh, '>', "$root/proc/self/cgroup" or die;
print $fh "0::/box\n";
close $fh;
open $fh, '>', "$root/proc/meminfo" or die;
print $fh "MemTotal: 25165824 kB\nMemAvailable: 20971520 kB\n";
close $fh;
system('chmod', '-R', 'a+rX', $root);

my $srv = private_server(<<'CONF', ready => '/ts?auto',
ThrottleZone reports limit=2 mem=200M
ThrottleZone plain limit=2
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
    env => { MOD_ADAPTIVE_THROTTLE_TEST_MEM_ROOT => $root });
my @warned = $srv->{log}->() =~ /(mem= \(zones: reports\): this server runs in cgroup \/box, whose memory limit cannot be read)/g;
ok t_cmp(scalar @warned, 1, 'one warning at startup names the zone and the cgroup');
my $auto = $srv->{get}->('/ts?auto')->{body};
ok t_cmp(($auto =~ /^Throttle\.reports\.MemSource: (\S+)$/m)[0], 'meminfo',
         'the status page says the reading comes from /proc/meminfo');
my $json = $srv->{get}->('/ts?json')->{body};
ok t_cmp(($json =~ /"name":"reports"[^}]*"mem_source":"(\w+)"/)[0], 'meminfo',
         'so does the JSON, as a word');
ok t_cmp(scalar(() = $auto =~ /^Throttle\.plain\.(?:Mem|HeldForMemory|LimitAuto|LimitHeld|Baseline|RecentService)/mg),
         0, 'a fixed zone without mem= shows no memory or limit=auto lines in ?auto');
my ($plain) = $json =~ /(\{"name":"plain"[^}]*\})/;
ok t_cmp(join(' ', map { $plain =~ /"$_":/ ? 1 : 0 } qw(mem_bytes mem_source limit_auto baseline_ms)),
         '1 1 1 1', 'the JSON keeps one schema for every zone');
$srv->{stop}->();
