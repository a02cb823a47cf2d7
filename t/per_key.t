# per_key: at most N requests of one key (key=EXPR, here the X-Api-Key
# header) running or waiting; beyond that the key's requests get 503 at
# once, from any address, while other keys and requests without a key
# still get in.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 16, need_cgi;

my $other = '127.0.0.2'; # another client: all of 127/8 is loopback on Linux
my %alice = (headers => { 'X-Api-Key' => 'alice' });
my $before = status_auto();

# perkey: limit 4, queue 10, per_key 2. Key alice takes two slots.
probe_reset('alice');
# They hold until the test releases them.
my @hold = map { bg_get("/perkey/probe.cgi?tag=alice&sleep=60000&release=1&id=hold$_", %alice) } 1 .. 2;
wait_until(sub { (probe_count("alice"))[0] == 2 }) or die "holders never started";

my $r = http_get('/perkey/probe.cgi?tag=alice&id=third', %alice);
ok t_cmp($r->{status}, 503, "a third request of the key is refused, with slots free");
# At once: the module's own measure of its time in the zone is far below
# the zone's 20-s timeout.
my ($waited) = $r->{body} =~ /wait_us=(\d+)/;
ok t_cmp(defined $waited && $waited < 1_000_000 ? 1 : 0, 1,
         sprintf('at once (%s us in the zone; %.3f s at the client)', $waited // '?', $r->{secs}));
ok t_cmp($r->{body}, qr/result=rejected-key/, 'THROTTLE_RESULT=rejected-key');
ok t_cmp(($r->{headers}{'retry-after'} // '') =~ /^[1-9]\d*$/, 1, 'with Retry-After');
ok t_cmp(http_get('/perkey/probe.cgi?tag=alice&id=moved', %alice, from => $other)->{status},
         503, 'the key counts from another address too');

my $auto = status_auto();
ok t_cmp($auto->{'Throttle.perkey.PerKey'}, 2, 'PerKey on the status page');
ok t_cmp($auto->{'Throttle.perkey.Clients'}, 1, 'one key in');
my ($busiest) = ($auto->{'Throttle.perkey.Busiest'} // '') =~ /^([0-9a-f]{16})=2$/;
ok t_cmp(defined $busiest, 1, "Busiest lists the key, hashed, with its 2 requests");

$r = http_get('/perkey/probe.cgi?tag=bob&id=bob', headers => { 'X-Api-Key' => 'bob' });
ok t_cmp($r->{status}, 200, 'another key gets in');
my ($bob) = $r->{body} =~ /key=([0-9a-f]{16})\b/;
ok t_cmp(defined $bob && $bob ne $busiest, 1, "THROTTLE_KEY names bob's key, not alice's");
# Two requests without a key at once, beside alice's two: the zone's
# limit of 4, not a key's, is what they meet.
probe_reset('nokey');
my @keyless = map { bg_get("/perkey/probe.cgi?tag=nokey&sleep=60000&release=1&id=n$_") } 1 .. 2;
wait_until(sub { (probe_count('nokey'))[0] == 2 }, 30);
probe_release('nokey');
ok t_cmp(join(' ', map { bg_wait($_)->{status} } @keyless), '200 200',
         'requests without a key are not limited by per_key');
ok t_cmp((probe_count('nokey'))[1], 2, 'and ran side by side');
probe_release('alice');
my ($alice_key) = bg_wait($hold[0])->{body} =~ /key=([0-9a-f]{16})\b/;
ok t_cmp($alice_key, $busiest, "alice's THROTTLE_KEY is what Busiest showed");
bg_wait($hold[1]);

my $after = status_auto();
ok t_cmp($after->{'Throttle.perkey.RejectedKey'} - ($before->{'Throttle.perkey.RejectedKey'} // 0),
         2, 'exactly the two refusals counted as RejectedKey');
my ($cur, $max) = probe_count('alice');
ok t_cmp($max, 2, "the key's CGIs ran 2 at once, never more");
ok t_cmp(http_get('/perkey/probe.cgi?tag=alice&id=again', %alice)->{status}, 200,
         'the key may run again once its requests ended');
