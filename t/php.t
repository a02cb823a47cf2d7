# Real PHP behind the module, the two ways the README's how-tos set it up:
# a php-fpm pool behind ThrottleHandler "proxy:*" (every MPM), and mod_php
# behind ThrottleHandler application/x-httpd-php (prefork only: Debian's
# mod_php is not thread-safe). For each, the cap holds as counted by PHP
# itself (t/php/probe.php counts its own copies), requests beyond the queue
# get 503 with Retry-After, and a location with "Throttle off" is answered
# while the zone is full.
#
# mod_php is the module of Debian's libapache2-mod-php8.2 unpacked by
# scripts/setup (MOD_PHP_SO), not installed: installing it would switch the
# system apache2 to prefork and enable PHP there.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use POSIX ();

my $fpm = (grep { -x } map { "/usr/sbin/php-fpm$_" } ('8.2', ''))[0];
my $apxs = $ENV{APXS} || 'apxs';
chomp(my $moddir = `$apxs -q LIBEXECDIR`);
my $modphp = $ENV{MOD_PHP_SO} // '/var/cache/mod_adaptive_throttle/libphp8.2.so';
my $prefork = ($ENV{MPM} // '') eq 'prefork';
plan tests => 20, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                         'php-fpm (scripts/setup installs php8.2-fpm)' => $fpm,
                         'mod_proxy_fcgi' => -f "$moddir/mod_proxy_fcgi.so" };

my $php = Apache::Test::vars('serverroot') . '/php';
my $common = <<"CONF";
ThrottleZone php limit=2 queue=2 timeout=20s
Alias /php/ "$php/"
<Directory "$php">
    Require all granted
</Directory>
<Location /throttle-status>
    SetHandler throttle-status
</Location>
CONF

# A php-fpm pool of 4 children, twice the zone's limit, so that a pool with
# room to spare shows the module, not the pool, holding the cap.
sub start_fpm {
    my ($dir) = @_;
    open my $fc, '>', "$dir/fpm.conf" or die;
    print $fc <<"FPM";
[global]
pid = $dir/fpm.pid
error_log = $dir/fpm.log
daemonize = no
[test]
user = nobody
group = nogroup
listen = $dir/fpm.sock
listen.mode = 0666
pm = static
pm.max_children = 4
pm.status_path = /fpm-status
FPM
    close $fc;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        exec $fpm, '-F', '-y', "$dir/fpm.conf" or POSIX::_exit(127);
    }
    wait_until(sub { -S "$dir/fpm.sock" }, 10) or die "php-fpm did not start: "
        . (-f "$dir/fpm.log" ? `cat $dir/fpm.log` : 'no log');
    return $pid;
}
my $fpm_pid;
END { kill 'TERM', $fpm_pid if $fpm_pid; }

# The checks, on a server whose *.php run in zone php and whose $exempt
# path is outside every zone (Throttle off).
sub check_php {
    my ($how, $srv, $probes, $exempt, $exempt_re) = @_;
    my $one = $srv->{get}->('/php/probe.php?tag=warm');
    ok t_cmp("$one->{status} " . ($one->{body} =~ /(zone=\S+ result=\S+)/)[0],
             '200 zone=php result=admitted', "$how: a PHP request runs in zone php and is told so");

    # 8 at once, each 2 s in PHP: 2 run, 2 wait, the rest are refused.
    my @pids = map { bg_get("/php/probe.php?tag=cap&sleep=2000", port => $srv->{port}) } 1 .. 8;
    my $full = wait_until(sub { (probe_count_in($probes, 'cap'))[0] == 2 }, 10);
    my $ex = $srv->{get}->($exempt);
    my @r = map { bg_wait($_) } @pids;
    my ($cur, $max) = probe_count_in($probes, 'cap');

    ok t_cmp($max, 2, "$how: PHP counted at most (and at some point exactly) 2 of itself at once");
    ok t_cmp($cur, 0, "$how: none left running");
    my @ok = grep { $_->{status} == 200 } @r;
    my @refused = grep { $_->{status} == 503 } @r;
    ok t_cmp(scalar(@ok) + scalar(@refused), 8, "$how: every answer is 200 or 503");
    ok t_cmp(scalar(@refused) >= 1 && scalar(@ok) >= 3 ? 1 : 0, 1,
             "$how: beyond the 2 running and 2 waiting, refused (" . scalar(@refused) . ' of 8)');
    ok t_cmp(scalar(grep { ($_->{headers}{'retry-after'} // '') =~ /^\d+$/ } @refused),
             scalar(@refused), "$how: every refusal carries Retry-After");
    ok t_cmp($full && $ex->{status} == 200 && $ex->{body} =~ $exempt_re ? 1 : 0, 1,
             "$how: $exempt (Throttle off) answered while the zone was full");

    # A page that sends its first bytes and flush()es them, then works: the
    # slot covers the work, not the first bytes.
    @pids = map { bg_get("/php/probe.php?tag=flush&flush=1&sleep=1000", port => $srv->{port}) }
            1 .. 4;
    @r = map { bg_wait($_) } @pids;
    ($cur, $max) = probe_count_in($probes, 'flush');
    ok t_cmp($max, 2, "$how: a page that flush()es before its work: at most (and at some point exactly) 2");
    ok t_cmp(scalar(grep { $_->{status} == 200 && $_->{body} =~ /^started\n.*result=/s } @r), 4,
             "$how: the 4 such pages answered whole (2 ran, 2 waited)");
    my $st = $srv->{get}->('/throttle-status?auto');
    my ($active, $queued) = map { $st->{body} =~ /^Throttle\.php\.$_:\s*(\d+)/m ? $1 : '?' }
                            qw(Active Queued);
    ok t_cmp("$active/$queued", '0/0', "$how: zone counts back to 0");
}

{
    my $dir = tempdir(CLEANUP => !$ENV{KEEP});
    chmod 0755, $dir;
    my $probes = tempdir(CLEANUP => 1);
    chmod 0777, $probes;
    $fpm_pid = start_fpm($dir);
    my $srv = private_server(<<"CONF" . $common);
LoadModule proxy_fcgi_module $moddir/mod_proxy_fcgi.so
SetEnv PROBE_DIR $probes
ThrottleHandler "proxy:*" php
<FilesMatch "\\.php\$">
    SetHandler "proxy:unix:$dir/fpm.sock|fcgi://localhost"
</FilesMatch>
<Location /fpm-status>
    SetHandler "proxy:unix:$dir/fpm.sock|fcgi://localhost"
    Throttle off
</Location>
CONF
    check_php('php-fpm', $srv, $probes, '/fpm-status', qr/active processes:\s*\d+/);
    $srv->{stop}->();
    kill 'TERM', $fpm_pid;
    waitpid $fpm_pid, 0;
    undef $fpm_pid;
}

if (!$prefork || !-f $modphp) {
    skip($prefork ? "mod_php: no $modphp (scripts/setup unpacks it)"
                  : 'mod_php: prefork only (Debian builds PHP without thread safety)')
        for 1 .. 10;
} else {
    my $probes = tempdir(CLEANUP => 1);
    chmod 0777, $probes;
    my $srv = private_server(<<"CONF" . $common);
LoadModule php_module $modphp
SetEnv PROBE_DIR $probes
ThrottleHandler application/x-httpd-php php
<FilesMatch "\\.php\$">
    SetHandler application/x-httpd-php
</FilesMatch>
<Location /php/exempt/>
    Throttle off
</Location>
AliasMatch ^/php/exempt/(.*)\$ "$php/\$1"
CONF
    check_php('mod_php', $srv, $probes, '/php/exempt/probe.php?tag=exempt',
              qr/zone=- result=-/);
    $srv->{stop}->();
}
