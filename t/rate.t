# rate=: requests per second (or minute) with a burst, for the zone or per
# key; beyond it a request gets 503 at once with a Retry-After that says
# when the bucket lets one through; with rate_delay= it waits its turn.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time);

plan tests => 17, need_cgi;

my $before = status_auto();
my $delta = sub {
    my ($after, $zone, $key) = @_;
    return ($after->{"Throttle.$zone.$key"} // 0) - ($before->{"Throttle.$zone.$key"} // 0);
};

# ratez: rate=1/m:2 — three at once, then the fourth waits a minute.
my @r = map { http_get("/ratez/probe.cgi?id=r$_") } 1 .. 4;
ok t_cmp(join(' ', map { $_->{status} } @r), '200 200 200 503',
         'a burst of 2 lets 3 requests through at once, the 4th is refused');
# At once: the module's own measure of its time in the zone is far below
# the minute it would have waited for the bucket.
my ($waited) = $r[3]{body} =~ /wait_us=(\d+)/;
ok t_cmp(defined $waited && $waited < 1_000_000 ? 1 : 0, 1,
         sprintf('at once (%s us in the zone; %.3f s at the client)', $waited // '?', $r[3]{secs}));
ok t_cmp($r[3]{body}, qr/result=rejected-rate/, 'THROTTLE_RESULT=rejected-rate');
my $ra = $r[3]{headers}{'retry-after'} // '';
ok t_cmp($ra =~ /^\d+$/ && $ra >= 50 && $ra <= 60, 1,
         "Retry-After says when the bucket lets one through: about a minute ($ra)");

my $auto = status_auto();
ok t_cmp($auto->{'Throttle.ratez.Rate'}, '0.017', 'Rate on the status page, per second');
ok t_cmp($auto->{'Throttle.ratez.RateBurst'}, 2, 'RateBurst');
ok t_cmp($delta->($auto, 'ratez', 'RejectedRate'), 1, 'one refusal counted as RejectedRate');

# ratekey: rate=1/m by X-Api-Key — each key has a bucket of its own;
# requests without a key are not limited.
my %alice = (headers => { 'X-Api-Key' => 'alice' });
my %bob = (headers => { 'X-Api-Key' => 'bob' });
ok t_cmp(http_get('/ratekey/probe.cgi?id=a1', %alice)->{status}, 200, "alice's first gets in");
my $r = http_get('/ratekey/probe.cgi?id=a2', %alice);
ok t_cmp($r->{status}, 503, "alice's second, within the minute, is refused");
ok t_cmp($r->{body}, qr/result=rejected-rate/, 'as rejected-rate');
ok t_cmp(http_get('/ratekey/probe.cgi?id=b1', %bob)->{status}, 200, 'bob has his own bucket');
ok t_cmp(join(' ', map { http_get("/ratekey/probe.cgi?id=n$_")->{status} } 1 .. 3),
         '200 200 200', 'requests without a key are not limited');
ok t_cmp(status_auto()->{'Throttle.ratekey.RateKeys'}, 2, 'RateKeys: two keys with a bucket');

# ratedly: rate=1/s:3 rate_delay=0 — four at once all run, each in its turn:
# the last no sooner than three intervals (3 s) after the first. The
# interval is long beside how far apart a loaded machine lets the four
# arrive (the last waits 3 s less that spread).
my $t0 = time;
my @pids = map { bg_get("/ratedly/probe.cgi?id=d$_") } 1 .. 4;
my @d = map { bg_wait($_) } @pids;
ok t_cmp(join(' ', map { $_->{status} } @d), '200 200 200 200',
         'within the burst, every request runs');
my @waits = sort { $a <=> $b } map { ($_->{body} =~ /wait_us=(\d+)/)[0] // 0 } @d;
ok t_cmp($waits[-1] >= 2_000_000, 1, "the last waited its turn, 2 intervals at least ($waits[-1] us)");
ok t_cmp(time - $t0 >= 2.95, 1, sprintf('and the four took at least 3 intervals (%.2f s)',
                                        time - $t0));
ok t_cmp($delta->(status_auto(), 'ratedly', 'RateDelayed'), 3, 'three counted as RateDelayed');
