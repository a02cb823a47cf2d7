# The example configurations in conf/examples parse, so does the shipped
# conf/adaptive_throttle.conf as is and with its setups uncommented, and
# the CGI example throttles requests that come from this host: a reverse proxy on the same
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
plan tests => 4, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                        'conf/examples copied beside the suite' => -d $examples };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $srv = private_server("Include $examples/cgi.conf\n" . cgi_conf($probes));
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
sub httpd_t {
    my ($ex) = @_;
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
    return $? == 0 ? '' : "$ex: $out";
}
my @bad = grep { $_ } map { httpd_t($_) } glob "$examples/*.conf";
print STDERR "# examples.t: $_" for @bad;
ok t_cmp(scalar @bad, 0, 'every example in conf/examples passes httpd -t');

# The configuration the packages install: safe as is, and each setup its
# comments show is a working configuration once uncommented.
my $shipped = Apache::Test::vars('serverroot') . '/../shipped/adaptive_throttle.conf';
my $as_is = -f $shipped ? httpd_t($shipped) : "no $shipped";
print STDERR "# examples.t: $as_is" if $as_is;
ok t_cmp($as_is, '', 'the shipped adaptive_throttle.conf passes httpd -t as is');
my $dir = tempdir(CLEANUP => 1);
my $n = 0;
if (open my $in, '<', $shipped) {
    open my $out, '>', "$dir/uncommented.conf" or die;
    while (my $line = <$in>) {
        $n++ if $line =~ s/^(\s*)#(Throttle\w+ )/$1$2/;
        print $out $line;
    }
}
my $uncommented = httpd_t("$dir/uncommented.conf");
print STDERR "# examples.t: $uncommented" if $uncommented;
ok t_cmp("$n lines, " . ($uncommented || 'httpd -t ok'), '6 lines, httpd -t ok',
         'its three setups, uncommented, pass httpd -t');
