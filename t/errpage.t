# An ErrorDocument 503 whose target is in the refusing zone itself (zone
# errpage, limit=1 queue=0, ErrorDocument 503 /errpage/probe.cgi): while one
# request holds the slot, the refused requests' error page has no free slot,
# so it must not run; the clients get httpd's own 503 page, Retry-After kept.
# Once the slot is free, an error page of the zone runs on it.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 7, need_cgi;

probe_reset('errpage');
my $hold = bg_get('/errpage/probe.cgi?tag=errpage&id=hold&sleep=2500');
wait_until(sub { (probe_count('errpage'))[0] == 1 }) or die 'holder never started';
my @r = parallel_get(map { '/errpage/probe.cgi?tag=errpage&id=refused' } 1 .. 6);
my $held = bg_wait($hold);
my (undef, $max) = probe_count('errpage');
my @ran = map { $_->[0] } probe_order('errpage');
print STDERR "# errpage.t: CGIs started: @ran; most at once $max\n";

ok t_cmp($held->{status}, 200, 'the holder ran');
ok t_cmp(join(' ', map { $_->{status} } @r), join(' ', (503) x 6), 'every other request got 503');
ok t_cmp($max, 1, 'the zone\'s CGIs, error pages included, never ran more than 1 at once');
ok t_cmp(scalar(grep { $_ eq 'page' } @ran), 0, 'no error page ran: the slot was never free');
ok t_cmp(scalar(grep { ($_->{headers}{'retry-after'} // '') =~ /^[1-9]\d*$/
                       && $_->{body} =~ /Service Unavailable/ } @r), 6,
         'each got httpd\'s own 503 page with Retry-After');

# A refusal of zone errsrc whose error page is in zone errpage, which has
# its slot free: the page runs, on that slot, and gives it back.
probe_reset('errpage');
probe_reset('errsrc');
$hold = bg_get('/errsrc/probe.cgi?tag=errsrc&id=hold&sleep=1500');
wait_until(sub { (probe_count('errsrc'))[0] == 1 }) or die 'holder never started';
my $page = http_get('/errsrc/probe.cgi?tag=errsrc&id=refused');
bg_wait($hold);
ok t_cmp($page->{status} . ' ' . ($page->{body} =~ /id=page/ ? 'page' : 'canned') . ' '
         . (($page->{headers}{'retry-after'} // '') =~ /^\d+$/ ? 'retry' : 'none'),
         '503 page retry', 'an error page in another zone with a free slot runs');
wait_until(sub { status_auto()->{'Throttle.errpage.Active'} == 0 }, 5);
ok t_cmp(status_auto()->{'Throttle.errpage.Active'}, 0, 'and gives its slot back');
