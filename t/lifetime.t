# ThrottleChildLifetime 5 9 with keep-alive off: each child draws a lifetime
# in 5..9 and retires after serving it (its pid disappears), under the MPM
# of this run. The status page shows each child's drawn lifetime.
#
# How exactly the MPM keeps the count is the MPM's: prefork checks before
# every accept (exact); worker counts a connection down only once its
# thread is done with it (after the lingering close), so its listener may
# accept a sequential client's next connections first. It checks the count
# before it waits for an idle thread and accepts: with every thread busy
# at that check and the count one short, each of them and the connection
# accepted after the wait are served, ThreadsPerChild (4 here) beyond the
# lifetime at most. Event's parent may also stop a child early when it has
# too many idle threads.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use JSON::PP;

plan tests => 7,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => ($ENV{INHERIT_CONF} && -f $ENV{INHERIT_CONF}) };

my $srv = private_server(<<'CONF');
KeepAlive Off
ThrottleChildLifetime 5 9
LogLevel warn adaptive_throttle:debug
LogFormat "%P %U" pidlog
CustomLog access_log pidlog
<IfModule mpm_prefork_module>
    StartServers 3
    MinSpareServers 3
    MaxSpareServers 16
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
my $errlog = $srv->{log}->();
my %drawn = $errlog =~ /child (\d+): lifetime (\d+) connections/g;
# Under prefork a child due to retire right after another one carries on a
# little (never beyond MAX): its lifetime is the draw plus its extensions.
my %lifetime = %drawn;
$lifetime{$1} += $2 while $errlog =~ /child (\d+): another child retired moments ago; serving (\d+) more/g;
my @retired = grep { my $p = $_; !grep { $_ == $p } @alive } keys %served;
my $mpm = $ENV{MPM} // 'prefork';
my $slack = $mpm eq 'prefork' ? 0 : 4; # ThreadsPerChild
my @over = grep { $served{$_} > ($lifetime{$_} // 0) + $slack } keys %served;
my @early = grep { $served{$_} < ($lifetime{$_} // 99) } @retired;
my $detail = join ' ', map { "$served{$_}/" . ($lifetime{$_} // '?') } sort { $a <=> $b } keys %served;
# t_cmp's report shows only with -verbose: say what was counted.
print STDERR "# lifetime.t ($mpm): served/lifetime per child: $detail\n";

ok t_cmp(scalar(grep { $_ == 200 } @st), 80, 'every request answered');
ok t_cmp(scalar(keys %served) >= 80 / 9, 1,
         'pids changed: ' . scalar(keys %served) . ' children served 80 connections');
ok t_cmp(scalar(grep { !defined $drawn{$_} || $drawn{$_} < 5 || $lifetime{$_} > 9 } keys %served), 0,
         'every child drew a lifetime in 5..9, extended at most to 9 (served/lifetime: ' . $detail . ')');
ok t_cmp(scalar(@over), 0, "no child served more than its lifetime (+$slack under $mpm;"
         . " served/lifetime: $detail)");
ok t_cmp(scalar(@early) <= 1, 1,
         scalar(@retired) . ' retired, ' . scalar(@early) . ' before their lifetime'
         . ' (at most 1 stopped early by the parent\'s spare-server maintenance)');
