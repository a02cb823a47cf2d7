# The example configurations in conf/examples parse, and the CGI example
# throttles requests that come from this host: a reverse proxy on the same
# machine sends every request from 127.0.0.1, so bypassing loopback would
# turn the throttle off for all of them.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);

my $examples = Apache::Test::vars('serverroot') . '/../examples';
plan tests => 2, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                        'conf/examples copied beside the suite' => -d $examples };

my $cgi = Apache::Test::vars('serverroot') . '/cgi-bin';
my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $srv = private_server(<<"CONF");
Include $examples/cgi.conf
SetEnv PROBE_DIR $probes
<Directory "$cgi">
    Options +ExecCGI
    Require all granted
</Directory>
ScriptAlias /cgi-bin/ "$cgi/"
CONF
my $r = $srv->{get}->('/cgi-bin/probe.cgi?tag=example');
ok t_cmp("$r->{status} " . ($r->{body} =~ /result=(\S+)/)[0], '200 admitted',
         'a CGI request from 127.0.0.1 is throttled, not bypassed');
$srv->{stop}->();

# Every example parses (httpd -t), with the modules it needs.
my $httpd = $ENV{HTTPD} || Apache::Test::vars('httpd');
my $apxs = $ENV{APXS} || 'apxs';
my $moddir = `$apxs -q LIBEXECDIR`;
chomp $moddir;
my @inherit = do { open my $in, '<', $ENV{INHERIT_CONF} or die; <$in> };
my @bad;
for my $ex (glob "$examples/*.conf") {
    my $dir = tempdir(CLEANUP => 1);
    open my $fh, '>', "$dir/httpd.conf" or die;
    print $fh @inherit;
    print $fh "LoadModule proxy_fcgi_module $moddir/mod_proxy_fcgi.so\n"
        unless grep { /proxy_fcgi/ } @inherit;
    print $fh "ServerRoot $dir\nServerName 127.0.0.1\nListen 127.0.0.1:1\n"
            . "DocumentRoot $dir\nDefaultRuntimeDir $dir\nPidFile $dir/pid\n"
            . "ErrorLog $dir/error_log\nInclude $ex\n";
    close $fh;
    my $out = `$httpd -t -d $dir -f $dir/httpd.conf 2>&1`;
    push @bad, "$ex: $out" unless $? == 0;
}
print STDERR "# examples.t: $_" for @bad;
ok t_cmp(scalar @bad, 0, 'every example in conf/examples passes httpd -t');
