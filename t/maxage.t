# ThrottleChildMaxAge: under prefork, idle children retire by age (their
# pids are replaced while nothing is requested); under worker and event the
# directive is refused at configuration time, naming prefork.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use Time::HiRes qw(time);

my $mpm = $ENV{MPM} // '';
plan tests => ($mpm eq 'prefork' ? 3 : 2),
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => ($ENV{INHERIT_CONF} && -f $ENV{INHERIT_CONF}) };

if ($mpm ne 'prefork') {
    my $dir = tempdir(CLEANUP => 1);
    open my $in, '<', $ENV{INHERIT_CONF} or die;
    my $modules = do { local $/; <$in> };
    open my $fh, '>', "$dir/httpd.conf" or die;
    print $fh $modules, "ServerRoot $dir\nServerName 127.0.0.1\nListen 127.0.0.1:1\n",
              "ErrorLog $dir/error_log\nThrottleChildMaxAge 1h 10%\n";
    close $fh;
    my $httpd = $ENV{HTTPD} || Apache::Test::vars('httpd');
    my $out = `'$httpd' -t -f '$dir/httpd.conf' 2>&1`;
    ok t_cmp($? >> 8 != 0, 1, "refused under $mpm");
    ok t_cmp($out, qr/ThrottleChildMaxAge \(.*\) needs the prefork MPM; under $mpm use ThrottleChildLifetime/,
             'message names prefork and the alternative');
    exit 0;
}

my $srv = private_server(<<'CONF');
StartServers 2
MinSpareServers 2
MaxSpareServers 3
ServerLimit 8
MaxRequestWorkers 8
ThrottleChildMaxAge 2s 0%
LogLevel warn adaptive_throttle:info
CONF
my @first = children_of($srv->{pid});
my $t0 = time;
my $gone = wait_until(sub {
    my %now = map { $_ => 1 } children_of($srv->{pid});
    !grep { $now{$_} } @first;
}, 45);
my $took = time - $t0;
my $after = $srv->{get}->('/hello.txt')->{status};
$srv->{stop}->();
print STDERR sprintf("# maxage.t: %d idle children replaced after %.1f s\n", scalar(@first), $took);
ok t_cmp($gone && @first >= 2, 1, sprintf('all %d idle children retired by age (%.1f s)',
                                          scalar(@first), $took));
ok t_cmp($srv->{log}->(), qr/retires at age \d+ s \(ThrottleChildMaxAge\)/, 'logged at info');
ok t_cmp($after, 200, 'the server answers with the new children');
