# rate= held against nginx's limit_req: Debian's nginx with
#   limit_req_zone $http_x_api_key zone=k:1m rate=10r/s;
#   limit_req zone=k burst=3 nodelay;
# and a private httpd with
#   ThrottleZone rl rate=10/s:3 key=%{HTTP:X-Api-Key}
# are sent the same trace of requests (keys at 5 to 40 requests a second
# each, some requests with no key), each request to both at once. Each
# server's answers are checked against an exact GCRA run on the times the
# client actually sent and got its answers: wherever that leaves no doubt
# about the decision, the server must have made it. nginx passing the same
# check shows that the model is limit_req's.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Time::HiRes qw(time sleep clock_gettime CLOCK_MONOTONIC);

my $nginx = $ENV{NGINX} // '/var/cache/mod_adaptive_throttle/nginx';
plan tests => 6, need {
    'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
    "Debian's nginx unpacked by scripts/setup ($nginx)" => -x $nginx,
};

my ($rate, $burst) = (10, 3);
my $interval = 1 / $rate;

# The trace: per key, arrivals at random (exponential gaps) at the key's
# own rate, for 6 s; a tenth of the requests carry no key. An arrival that
# an exact GCRA finds within $edge of its bucket's edge is moved on until
# it is $edge inside: a client or server late by less than that does not
# change the decision.
my ($seed, $replay) = test_seed('RATE_SEED');
srand($seed);
my $edge = 0.025;
my @trace;
my %per_sec = (k1 => 5, k2 => 8, k3 => 10, k4 => 15, k5 => 20, k6 => 40);
for my $k (sort keys %per_sec) {
    my $tat = 0;
    for (my $t = rand(0.2); $t < 6; $t += -log(1 - rand()) / $per_sec{$k}) {
        my $ahead = $tat > $t ? $tat - $t : 0;
        if (abs($ahead - $burst * $interval) < $edge) {
            $t = $tat - $burst * $interval + $edge;
            $ahead = $tat - $t;
        }
        $tat = ($ahead ? $tat : $t) + $interval if $ahead <= $burst * $interval;
        push @trace, [$t, $k];
    }
}
push @trace, map { [rand(6), ''] } 1 .. int(@trace / 10);
@trace = sort { $a->[0] <=> $b->[0] } @trace;

# nginx, on a loopback port of its own, in a directory of its own.
my $dir = tempdir(CLEANUP => !$ENV{KEEP});
chmod 0755, $dir;
my $nport = free_port();
open my $fh, '>', "$dir/nginx.conf" or die;
print $fh <<"CONF";
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    limit_req_zone \$http_x_api_key zone=k:1m rate=${rate}r/s;
    server {
        listen 127.0.0.1:$nport;
        location / {
            limit_req zone=k burst=$burst nodelay;
            root $dir/www; # a file, not "return": that answers before limit_req runs
        }
    }
}
CONF
close $fh;
mkdir "$dir/www" or die;
open $fh, '>', "$dir/www/ok.txt" or die;
print $fh "ok\n";
close $fh;
chmod 0755, "$dir/www";
chmod 0644, "$dir/www/ok.txt";
system($nginx, '-p', $dir, '-c', "$dir/nginx.conf", '-e', "$dir/error.log") == 0
    or die "nginx did not start: " . `cat $dir/error.log`;
wait_until(sub { -s "$dir/nginx.pid" }, 10) or die 'nginx wrote no pid file';
chomp(my $npid = `cat $dir/nginx.pid`);
END { kill 'TERM', $npid if $npid }

my $srv = private_server(<<"CONF");
ThrottleZone rl limit=100 queue=0 rate=$rate/s:$burst key=%{HTTP:X-Api-Key}
<Location /hello.txt>
    Throttle rl
</Location>
CONF
wait_until(sub { send_get($nport, '/ok.txt', '')->() }, 10) or die 'nginx does not answer';

# Sends a request; returns a sub that reads its status.
sub send_get {
    my ($port, $path, $key) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 10)
        or return sub { 0 };
    my $h = $key eq '' ? '' : "X-Api-Key: $key\r\n";
    print $s "GET $path HTTP/1.0\r\nHost: 127.0.0.1\r\n$h\r\n";
    return sub {
        local $/;
        my $raw = <$s> // '';
        close $s;
        return ($raw =~ m{^HTTP/\S+ (\d+)})[0] // 0;
    };
}

sub now { clock_gettime(CLOCK_MONOTONIC) }

# The replay: each request to both servers, one right after the other (in
# turn which first), then both answers read. Each server decided between
# the moment the client began to send and the moment it had the answer:
# [$lo, $hi], on the monotonic clock both servers read.
my (%st, %lo, %hi);
my $t0 = now() + 0.2;
for my $i (0 .. $#trace) {
    my ($t, $k) = @{ $trace[$i] };
    my $left = $t0 + $t - now();
    sleep $left if $left > 0;
    my @order = $i % 2 ? ('at', 'ngx') : ('ngx', 'at');
    my %read;
    for my $who (@order) {
        $lo{$who}[$i] = now();
        $read{$who} = $who eq 'at' ? send_get($srv->{port}, '/hello.txt', $k)
                                   : send_get($nport, '/ok.txt', $k);
    }
    for my $who (@order) {
        $st{$who}[$i] = $read{$who}->();
        $hi{$who}[$i] = now();
    }
}
my $late = now() - $t0 - $trace[-1][0];

# An exact GCRA run on one server's own decisions, with each bucket's
# theoretical arrival time known to within an interval, as each decision's
# time is. A request is judged only where every time in those intervals
# gives the same decision, with $clock to spare for nginx's millisecond
# clock. Returns (judged, admitted among them, refused, the differences).
my $clock = 0.002;
sub judge {
    my ($who) = @_;
    my (%tat_lo, %tat_hi, @wrong);
    my ($judged, $admit, $refuse) = (0, 0, 0);
    my $full = $burst * $interval;
    for my $i (0 .. $#trace) {
        my $k = $trace[$i][1];
        next if $k eq '';
        my ($lo, $hi, $st) = ($lo{$who}[$i], $hi{$who}[$i], $st{$who}[$i]);
        my $least = ($tat_lo{$k} // 0) - $hi;
        my $most = ($tat_hi{$k} // 0) - $lo;
        my $want = $most <= $full - $clock ? 200 : $least > $full + $clock ? 503 : 0;
        if ($want) {
            $judged++;
            $want == 200 ? $admit++ : $refuse++;
            push @wrong, sprintf('%.3f s key %s: %d, the model %d (%.1f to %.1f ms ahead)',
                                 $trace[$i][0], $k, $st, $want, 1000 * ($least > 0 ? $least : 0),
                                 1000 * ($most > 0 ? $most : 0)) if $st != $want;
        }
        # What the server did is what its bucket spent (an unknown answer:
        # either).
        if ($st != 503) {
            my $l = ($tat_lo{$k} // 0) > $lo ? $tat_lo{$k} : $lo;
            my $h = ($tat_hi{$k} // 0) > $hi ? $tat_hi{$k} : $hi;
            $tat_lo{$k} = $l + $interval if $st == 200;
            $tat_hi{$k} = $h + $interval;
        }
    }
    return ($judged, $admit, $refuse, @wrong);
}

my $n = @trace;
my $keyed = grep { $_->[1] ne '' } @trace;
my %j = map { $_ => [judge($_)] } qw(ngx at);
my $same = grep { $st{ngx}[$_] == $st{at}[$_] } 0 .. $#trace;
my $refused = grep { $_ == 503 } @{ $st{ngx} };
my $summary = sprintf '%d requests in %.1f s, the client %.3f s late; refused: nginx %d, httpd '
    . '%d; the same decision for %.2f %%; judged: nginx %d (%d admitted, %d refused), httpd '
    . '%d (%d, %d)', $n, $trace[-1][0], $late, $refused, scalar(grep { $_ == 503 } @{ $st{at} }),
    100 * $same / $n, @{ $j{ngx} }[0 .. 2], @{ $j{at} }[0 .. 2];
t_debug("seed $seed: $summary");
my $failed = 0;
ok t_cmp(scalar(grep { $_ != 200 && $_ != 503 } @{ $st{ngx} }, @{ $st{at} }), 0,
         'every answer from both is 200 or 503') or $failed++;
# Enough judged decisions of each kind to tell a wrong rate or burst: at
# least a third of the keyed requests, a tenth of them refusals.
ok t_cmp(!grep({ $j{$_}[0] < $keyed / 3 || $j{$_}[2] < $keyed / 10 } qw(ngx at)) ? 1 : 0, 1,
         "judged enough of the $keyed keyed requests to tell (seed $seed): $summary") or $failed++;
for (['ngx', 'nginx follows the model'], ['at', 'httpd follows the model']) {
    my ($who, $what) = @$_;
    my ($judged, undef, undef, @wrong) = @{ $j{$who} };
    ok t_cmp(scalar(@wrong), 0, "$what in each of the $judged decisions it leaves no doubt "
             . "about (seed $seed)") or $failed++;
    print STDERR map { "# rate_nginx.t: $who differs: $_\n" } @wrong;
}
my @keyless = grep { $trace[$_][1] eq '' } 0 .. $#trace;
ok t_cmp(join('', map { $st{at}[$_] } @keyless) =~ /^(200)+$/ ? 1 : 0, 1,
         'requests without a key are never refused (nginx: not accounted)') or $failed++;
ok t_cmp(join('', map { $st{ngx}[$_] } @keyless) =~ /^(200)+$/ ? 1 : 0, 1, 'nor by nginx')
    or $failed++;
print STDERR "# rate_nginx.t: seed $seed: $summary\n# replay: $replay\n" if $failed;
$srv->{stop}->();
