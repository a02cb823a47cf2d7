# An upgrade under a running server: the module's file is replaced by a
# build whose shared layout differs by one field (a longer zone name), as a
# package upgrade replaces it, and the server is reloaded (-k graceful)
# while requests run; then the first build comes back with -k restart. Each
# time the new build must lay its zones anew rather than read the old
# layout, nothing may crash, every request answered must be answered 200,
# and the requests the new build admits never run more than the limit.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Copy qw(copy);
use File::Temp qw(tempdir);

plan tests => 8, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} },
    { 'a build of another layout (OTHER_LAYOUT_SO)' => $ENV{OTHER_LAYOUT_SO} && -f $ENV{OTHER_LAYOUT_SO} };

my $probes = tempdir(CLEANUP => 1);
chmod 0777, $probes;
my $spool = tempdir(CLEANUP => 1);
chmod 0755, $spool;
my $so = "$spool/mod_adaptive_throttle.so";

# Replaced as a package manager does: the new file renamed over the old,
# whose pages the running processes keep.
sub install_build {
    my ($from) = @_;
    copy($from, "$so.new") or die "$from: $!";
    chmod 0644, "$so.new";
    rename "$so.new", $so or die "$so: $!";
}
install_build($ENV{MODULE_SO});

# mod_cgi: mod_cgid restarts its daemon at a graceful restart (see
# graceful_storm.t)
my $srv = private_server("ThrottleZone up limit=2 queue=10 timeout=20s\n"
                         . "LogLevel adaptive_throttle:info\n"
                         . cgi_conf($probes) . "<Location /cgi-bin/>\n    Throttle up\n"
                         . "</Location>\n", cgi_not_cgid => 1, module => $so);
sub resumed { scalar(() = $srv->{log}->() =~ /resuming normal operations/g) }
sub laid_anew { scalar(() = $srv->{log}->() =~ /zone up: its shared memory cannot be kept/g) }
sub crashed { $srv->{log}->() =~ /exit signal|Segmentation|AddressSanitizer|double free/ }

sub run {
    my ($tag, $n, $sleep) = @_;
    return map { bg_get("/cgi-bin/probe.cgi?tag=$tag&sleep=$sleep&id=$tag$_", port => $srv->{port}) }
           1 .. $n;
}

# Two requests of the first build run across the reload.
my @old = run('old', 2, 3000);
wait_until(sub { (probe_count_in($probes, 'old'))[0] == 2 }, 10) or die 'the first two never ran';
install_build($ENV{OTHER_LAYOUT_SO});
my $before = resumed();
kill 'USR1', $srv->{pid};
wait_until(sub { resumed() > $before }, 10) or die 'no graceful restart';
my @r = map { bg_wait($_) } @old, run('new', 6, 300);
ok t_cmp(scalar(grep { $_->{status} == 200 } @r), 8,
         'across the reload into another layout, every request answered 200');
ok t_cmp((probe_count_in($probes, 'new'))[1], 2,
         'the new build ran at most the limit at once');
ok t_cmp(laid_anew(), 1, 'the new build laid the zone anew, not on the old layout');
ok t_cmp(crashed() ? 1 : 0, 0, 'no process crashed');

# Back to the first build, by a hard restart: requests caught by it are
# cut with their children; the ones after it are served as before.
install_build($ENV{MODULE_SO});
$before = resumed();
kill 'HUP', $srv->{pid};
wait_until(sub { resumed() > $before }, 10) or die 'no restart';
wait_until(sub { $srv->{get}->('/hello.txt')->{status} == 200 }, 10);
@r = map { bg_wait($_) } run('back', 6, 300);
ok t_cmp(scalar(grep { $_->{status} == 200 } @r), 6, 'after the restart, every request answered 200');
ok t_cmp((probe_count_in($probes, 'back'))[1], 2, 'the first build ran at most the limit at once');
ok t_cmp(laid_anew(), 2, 'the first build laid the zone anew too');
ok t_cmp(crashed() ? 1 : 0, 0, 'no process crashed');
$srv->{stop}->();
