# limit=auto without max=: the ceiling comes from the workers the server
# has (MaxRequestWorkers), less those ThrottleKeepIdleWorkers keeps idle and
# what the other zones may run and queue, shared by the zones that leave
# max unset. The status page names where each zone's max came from.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 8, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

# 60 workers - 4 kept idle - fixed (5 + 5) - given (8 + 2) = 36 for two zones.
my $srv = private_server(<<'CONF', ready => '/ts?auto');
<IfModule mpm_prefork_module>
    StartServers 2
    ServerLimit 60
    MaxRequestWorkers 60
</IfModule>
<IfModule !mpm_prefork_module>
    StartServers 1
    ServerLimit 6
    ThreadsPerChild 10
    MaxRequestWorkers 60
</IfModule>
ThrottleKeepIdleWorkers 4
ThrottleZone fixed limit=5 queue=5
ThrottleZone given limit=auto max=8 queue=2
ThrottleZone io limit=auto
ThrottleZone io2 limit=auto queue=3
<Location /ts>
    SetHandler throttle-status
</Location>
CONF
my $auto = $srv->{get}->('/ts?auto')->{body};
my %v = $auto =~ /^Throttle\.(\w+\.\w+): (\S+)$/mg;
# io: a default queue keeps at most a quarter of its 18: 4, max the rest.
ok t_cmp("$v{'io.LimitMax'} $v{'io.QueueCapacity'}", '14 4',
         'a zone without max= gets its share of the workers, less its queue');
ok t_cmp($v{'io.LimitMaxFrom'}, 'workers', 'the status page says max came from the workers');
ok t_cmp("$v{'io2.LimitMax'} $v{'io2.QueueCapacity'}", '15 3',
         'a queue given is kept, and max takes the rest of the share');
ok t_cmp("$v{'given.LimitMax'} $v{'given.LimitMaxFrom'}", '8 max=', 'a max given is kept');
ok t_cmp(!exists $v{'fixed.LimitMaxFrom'}, 1, 'a fixed zone has no such line');
my $cpus = do { my $n = `getconf _NPROCESSORS_ONLN`; chomp $n; $n || 1 };
ok t_cmp($v{'io.Limit'}, $cpus * 2 < 14 ? $cpus * 2 : 14,
         'the limit starts at twice the CPUs, no higher than max');
my $json = $srv->{get}->('/ts?json')->{body};
ok t_cmp(($json =~ /"name":"io"[^}]*"limit_max_from":"(\w+)"/)[0], 'workers',
         'the JSON says it as a word');
my @warned = $srv->{log}->() =~ /zones' running \+ waiting requests/g;
ok t_cmp(scalar @warned, 0, 'the shares fit the workers: no warning that they are short');
$srv->{stop}->();
