# per_client: one client address may have at most N requests running or
# waiting; beyond that it gets 503 at once, while other addresses still get
# in. Headers and query strings do not change who the client is.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 11, need_cgi;

my $other = '127.0.0.2'; # another client: all of 127/8 is loopback on Linux
my $before = status_auto();

# perc: limit 2, queue 10, per_client 2. Client 127.0.0.1 takes both slots.
probe_reset('perc');
# They hold until the test releases them.
my @hold = map { bg_get("/perc/probe.cgi?tag=perc&sleep=60000&release=1&id=hold$_") } 1 .. 2;
wait_until(sub { (probe_count('perc'))[0] == 2 }) or die 'holders never started';

ok t_cmp(status_auto()->{'Throttle.perc.Busiest'}, '127.0.0.1=2',
         'Busiest names the address and its 2 requests');
my $r = http_get('/perc/probe.cgi?tag=perc&id=third', timeout => 15);
ok t_cmp($r->{status}, 503, 'a third request from the same address is refused');
# At once: the module's own measure of its time in the zone is far below
# the zone's 20-s timeout.
my ($waited) = $r->{body} =~ /wait_us=(\d+)/;
ok t_cmp(defined $waited && $waited < 1_000_000 ? 1 : 0, 1,
         sprintf('at once (%s us in the zone; %.3f s at the client)', $waited // '?', $r->{secs}));
ok t_cmp($r->{body}, qr/result=rejected-client/, 'THROTTLE_RESULT=rejected-client');
ok t_cmp(($r->{headers}{'retry-after'} // '') =~ /^[1-9]\d*$/, 1, 'with Retry-After');

# Headers a client controls, and the query string, change nothing.
# (Taken for another client, it would wait behind the holders: 15 s at most.)
$r = http_get('/perc/probe.cgi?tag=perc&id=spoof&client=10.1.1.1', timeout => 15,
              headers => { 'X-Forwarded-For' => '10.9.9.9', 'X-Real-IP' => '10.9.9.8',
                           'Forwarded' => 'for=10.9.9.7' });
ok t_cmp("$r->{status} " . (($r->{body} =~ /result=([\w-]+)/)[0] // '-'), '503 rejected-client',
         'forwarding headers do not make it another client');

# Another address waits in the queue and runs when a slot frees.
my $queued = bg_get('/perc/probe.cgi?tag=perc&id=other', from => $other);
wait_until(sub { status_auto()->{'Throttle.perc.Queued'} == 1 })
    or die 'the other client was not queued';
ok t_cmp(status_auto()->{'Throttle.perc.Clients'}, 2, 'two client addresses in');
probe_release('perc');
ok t_cmp(bg_wait($queued)->{status}, 200, 'the other client was served');
bg_wait($_) for @hold;

my $after = status_auto();
ok t_cmp($after->{'Throttle.perc.RejectedClient'} - ($before->{'Throttle.perc.RejectedClient'} // 0),
         2, 'exactly the two refusals counted as RejectedClient');
my ($cur, $max) = probe_count('perc');
ok t_cmp($max <= 2, 1, "the CGIs saw at most 2 running at once ($max)");
# Everything given back: the first address may run again.
ok t_cmp(http_get('/perc/probe.cgi?tag=perc&id=again')->{status}, 200,
         'the address may run again once its requests ended');
