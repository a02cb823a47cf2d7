# read_body_total=10k (zone bodytotal, limit=1, read_body=4k): while a CGI
# holds the zone's one slot, six POSTs of 3000 bytes queue. The bytes their
# bodies hold, read first, stay within the bound on the status page (three
# bodies: 9000; a fourth would pass 10240), and go back to 0 once the queue
# has drained; every POST's CGI receives its whole body, byte for byte,
# whether it was read first or left to the handler.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Digest::MD5 qw(md5_hex);
use File::Temp qw(tempdir);

plan tests => 6, need need_cgi(),
    { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF} };

my $posts = 6;
my $dir = tempdir(CLEANUP => 1);

sub stat_of { status_auto()->{"Throttle.bodytotal.$_[0]"} // -1 }

# POST $body to the echo CGI; the status and answer go to a file of $dir.
sub post_in_background {
    my ($i, $body) = @_;
    my $pid = fork // die "fork: $!";
    return $pid if $pid;
    my $sock = ThrottleT::connect_server();
    print $sock "POST /bodytotal/echo.cgi HTTP/1.0\r\nHost: " . hostport()
        . "\r\nContent-Length: " . length($body) . "\r\n\r\n", $body;
    local $/;
    my $raw = <$sock> // '';
    my ($status) = $raw =~ m{^HTTP/\S+ (\d+)};
    my (undef, $answer) = split /\r\n\r\n/, $raw, 2;
    open my $fh, '>', "$dir/$i" or die;
    print $fh ($status // 0), ' ', ($answer // '');
    close $fh;
    require POSIX;
    POSIX::_exit(0);
}

probe_reset('bodytotal');
my $holder = bg_get('/bodytotal/probe.cgi?tag=bodytotal&sleep=60000&release=1');
ok t_cmp(wait_until(sub { stat_of('Active') == 1 }, 30), 1, 'a CGI holds the one slot');

my @bodies = map { my $k = $_; join '', map { chr(($_ * 13 + $k) % 256) } 1 .. 3000 } 1 .. $posts;
my @pids = map { post_in_background($_, $bodies[$_]) } 0 .. $posts - 1;

# Every figure read while they queue stays within the bound.
my ($most, $reads) = (0, 0);
my $all_queued = wait_until(sub {
    my $s = status_auto();
    my $held = $s->{'Throttle.bodytotal.ReadBodyHeld'} // -1;
    $most = $held if $held > $most;
    $reads++;
    return ($s->{'Throttle.bodytotal.Queued'} // 0) == $posts;
}, 60);
ok t_cmp($all_queued, 1, "the $posts POSTs wait for the slot");
my $held = stat_of('ReadBodyHeld');
$most = $held if $held > $most;
ok t_cmp($held, 9000, 'the waiting requests hold three bodies read first, not more');
ok t_cmp($most <= 10240 ? 1 : 0, 1, "at most the bound held in $reads reads (most: $most)");

probe_release('bodytotal');
bg_wait($holder);
waitpid($_, 0) for @pids;
my @wrong;
for my $i (0 .. $posts - 1) {
    open my $fh, '<', "$dir/$i" or do { push @wrong, "$i: no answer"; next };
    my $got = do { local $/; <$fh> };
    push @wrong, "$i: $got" unless $got =~ /^200 len=3000 md5=${\ md5_hex($bodies[$i])} /;
}
ok t_cmp("@wrong", '', "each of the $posts CGIs received its whole body");
ok t_cmp(wait_until(sub { stat_of('ReadBodyHeld') == 0 }, 10), 1,
         'the bytes go back once the queue has drained');
