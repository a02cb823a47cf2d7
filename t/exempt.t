# Zones chosen by final handler (ScriptAlias and AddHandler CGIs, ProxyPass,
# SetHandler proxy:...), and what is exempt: Throttle off, ThrottleBypass,
# and static files, which are never queued behind a full zone.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

plan tests => 10, need_cgi;

probe_reset('h');
my $hold = bg_get('/addh/probe.cgi?tag=h&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('h'))[0] == 1 }) or die 'holder never started';

my $r = http_get('/sa/probe.cgi?tag=h2');
ok t_cmp($r->{status}, 503, 'ScriptAlias CGI falls under ThrottleHandler cgi-script');
$r = http_get('/addh/probe.cgi?tag=h2');
ok t_cmp($r->{status}, 503, 'AddHandler CGI falls under ThrottleHandler cgi-script');
$r = http_get('/free/probe.cgi?tag=h2');
ok t_cmp("$r->{status} $r->{body}", qr/^200 zone= result= /, 'Throttle off exempts');
$r = http_get('/addh/probe.cgi?tag=h2', headers => { 'X-Health' => 'yes' });
ok t_cmp("$r->{status} $r->{body}", qr/^200 zone=handler result=bypass /,
         'ThrottleBypass exempts and says so');
# Not delayed: answered while the holder, which runs until released, still
# holds the zone's only slot.
$r = http_get('/static/hello.txt', timeout => 30);
my $running = (probe_count('h'))[0];
ok t_cmp($r->{status}, 200, 'static file served while the zone is full');
ok t_cmp($running, 1, "static file not delayed behind the zone: the holder still ran ($r->{secs} s)");
probe_release('h');
ok t_cmp(bg_wait($hold)->{status}, 200, 'holder finished');

SKIP: {
    skip 'mod_proxy_http not loaded', 3 unless need_module('proxy_http');
    probe_reset('p');
    $hold = bg_get('/prox/probe.cgi?tag=p&sleep=60000&release=1&id=hold');
    wait_until(sub { (probe_count('p'))[0] == 1 }) or die 'proxied holder never started';
    $r = http_get('/prox/probe.cgi?tag=p2');
    ok t_cmp($r->{status}, 503, 'ProxyPass (proxy-server) falls under its zone');
    $r = http_get('/hprox/free/probe.cgi?tag=p2');
    ok t_cmp($r->{status}, 503, 'SetHandler proxy:http://... matches "proxy:*"');
    probe_release('p');
    ok t_cmp(bg_wait($hold)->{status}, 200, 'proxied holder finished');
}
