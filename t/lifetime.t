# ThrottleChildLifetime 5 9 with keep-alive off: every child serves between
# 5 and 9 connections, then retires (its pid disappears), under the MPM of
# this run. The status page shows each child's drawn lifetime.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use JSON::PP;

plan tests => 6,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => ($ENV{INHERIT_CONF} && -f $ENV{INHERIT_CONF}) };

my $srv = private_server(<<'CONF');
KeepAlive Off
ThrottleChildLifetime 5 9
LogFormat "%P %U" pidlog
CustomLog access_log pidlog
<IfModule mpm_prefork_module>
    StartServers 3
    MinSpareServers 3
    MaxSpareServers 6
    ServerLimit 16
    MaxRequestWorkers 16
</IfModule>
<IfModule !mpm_prefork_module>
    StartServers 3
    ServerLimit 16
    ThreadsPerChild 4
    MinSpareThreads 4
    MaxSpareThreads 64
    MaxRequestWorkers 64
</IfModule>
<Location /throttle-status>
    SetHandler throttle-status
</Location>
CONF

my $json = decode_json($srv->{get}->('/throttle-status?json')->{body});
my @lives = map { $_->{lifetime} } @{ $json->{children} || [] };
ok t_cmp(scalar(@lives) >= 1, 1, 'status page lists the children (' . scalar(@lives) . ')');
ok t_cmp(scalar(grep { $_ < 5 || $_ > 9 } @lives), 0, "drawn lifetimes within 5..9: @lives");

my @st = map { $srv->{get}->('/hello.txt')->{status} } 1 .. 80;
my @alive = children_of($srv->{pid});
$srv->{stop}->();

my %served;
open my $log, '<', "$srv->{dir}/access_log" or die;
while (<$log>) {
    $served{$1}++ if m{^(\d+) /hello\.txt};
}
my @retired = grep { my $p = $_; !grep { $_ == $p } @alive } keys %served;
ok t_cmp(scalar(grep { $_ == 200 } @st), 80, 'every request answered');
ok t_cmp(scalar(keys %served) >= 80 / 9, 1,
         'pids changed: ' . scalar(keys %served) . ' children served 80 connections');
ok t_cmp(scalar(grep { $_ > 9 } values %served), 0,
         'no child served more than 9 connections: ' . join(' ', sort { $a <=> $b } values %served));
ok t_cmp(scalar(grep { $served{$_} < 5 } @retired), 0,
         'every retired child served at least 5 (' . scalar(@retired) . ' retired)');
