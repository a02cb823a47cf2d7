# Without mod_status the module starts and serves its own status page with
# no error; and at the default LogLevel nothing is logged per request.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Time::HiRes qw(sleep);

my $inherit = $ENV{INHERIT_CONF};
plan tests => 5,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => ($inherit && -f $inherit) };

my $httpd = $ENV{HTTPD} || Apache::Test::vars('httpd');
my $dir = tempdir(CLEANUP => 1);
chmod 0755, $dir;
my $port = do {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1) or die;
    $s->sockport;
};

open my $in, '<', $inherit or die;
my @modules = grep { !/mod_status\.so/ } <$in>;
open my $fh, '>', "$dir/httpd.conf" or die;
print $fh @modules, <<"CONF";
ServerRoot $dir
ServerName 127.0.0.1
Listen 127.0.0.1:$port
PidFile $dir/httpd.pid
ErrorLog $dir/error_log
DefaultRuntimeDir $dir
TypesConfig /dev/null
User nobody
Group nogroup
ThrottleZone alone limit=1 queue=0
<Location /throttle-status>
    SetHandler throttle-status
</Location>
CONF
close $fh;

system($httpd, '-d', $dir, '-f', "$dir/httpd.conf", '-k', 'start') == 0
    or die 'httpd did not start: ' . (do { local (@ARGV, $/) = ("$dir/error_log"); <> } // '');
my $body = '';
for (1 .. 50) {
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or do { sleep 0.1; next };
    print $s "GET /throttle-status?auto HTTP/1.0\r\n\r\n";
    local $/;
    $body = <$s> // '';
    last;
}
for (1 .. 5) {
    my $s = IO::Socket::INET->new("127.0.0.1:$port") or next;
    print $s "GET /throttle-status?json HTTP/1.0\r\n\r\n";
    local $/;
    <$s>;
}
my $pid = do { local (@ARGV, $/) = ("$dir/httpd.pid"); <> };
chomp $pid;
kill 'TERM', $pid;
sleep 0.1 while kill 0, $pid;
my $log = do { local (@ARGV, $/) = ("$dir/error_log"); <> } // '';

ok t_cmp($body, qr{^HTTP/1\.\d 200}, 'status page answers without mod_status');
ok t_cmp($body, qr{^Throttle\.alone\.Limit: 1\r?$}m, 'with the zone');
ok t_cmp($log =~ /\[(emerg|alert|crit|error)\]|:(emerg|alert|crit|error)\]/ ? $log : '', '',
         'no error in the log');
ok t_cmp($log, qr/resuming normal operations/, 'the server ran');
ok t_cmp(join('', grep { /adaptive_throttle/ } split /\n/, $log), '',
         'nothing from the module per request at the default LogLevel');
