# rate= held against nginx's limit_req: Debian's nginx with
#   limit_req_zone $http_x_api_key zone=k:1m rate=10r/s;
#   limit_req zone=k burst=3 nodelay;
# and a private httpd with
#   ThrottleZone rl rate=10/s:3 key=%{HTTP:X-Api-Key}
# are sent the same trace of requests (keys at 5 to 40 requests a second
# each, some requests with no key), each request to both at once, and must
# make the same decision (admit or refuse) for at least 99 % of them. The
# differences are listed with how far the request was from its bucket's
# edge (see the trace below).
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

my $nginx = $ENV{NGINX} // '/var/cache/mod_adaptive_throttle/nginx';
plan tests => 5, need {
    'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
    "Debian's nginx unpacked by scripts/setup ($nginx)" => -x $nginx,
};

my ($rate, $burst) = (10, 3);
my $interval = 1 / $rate;

# The trace: per key, arrivals at random (exponential gaps) at the key's
# own rate, for 6 s; a tenth of the requests carry no key. Seeded, printed.
# An arrival that an exact GCRA finds within 3 ms of its bucket's edge is
# moved on by 4 ms: there the decision is the clock's, not the algorithm's
# (nginx counts whole milliseconds, and each request reaches one server a
# fraction of a millisecond before the other).
my $seed = $ENV{RATE_SEED} // (time ^ $$) & 0xffffff;
srand($seed);
my @trace;
my %per_sec = (k1 => 5, k2 => 8, k3 => 10, k4 => 15, k5 => 20, k6 => 40);
for my $k (sort keys %per_sec) {
    my $tat = 0;
    for (my $t = rand(0.2); $t < 6; $t += -log(1 - rand()) / $per_sec{$k}) {
        my $ahead;
        while (1) {
            $ahead = $tat > $t ? $tat - $t : 0;
            last if abs($ahead - $burst * $interval) >= 0.003;
            $t += 0.004;
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

# The replay: each request to both servers, one right after the other (in
# turn which first), then both answers read.
my (@ngx, @at);
my $t0 = time + 0.2;
for my $i (0 .. $#trace) {
    my ($t, $k) = @{ $trace[$i] };
    my $left = $t0 + $t - time;
    sleep $left if $left > 0;
    my @read = $i % 2 ? (send_get($srv->{port}, '/hello.txt', $k), send_get($nport, '/ok.txt', $k))
                      : (send_get($nport, '/ok.txt', $k), send_get($srv->{port}, '/hello.txt', $k));
    my @st = map { $_->() } @read;
    @st = reverse @st if $i % 2;
    push @ngx, $st[0];
    push @at, $st[1];
}
my $late = time - $t0 - $trace[-1][0];

# What an exact GCRA makes of the trace, and how far each request was
# from its bucket's edge (ms): where a difference is expected.
my (%tat, @margin);
for my $e (@trace) {
    my ($t, $k) = @$e;
    if ($k eq '') { push @margin, 1e9; next }
    my $ahead = ($tat{$k} // 0) > $t ? $tat{$k} - $t : 0;
    push @margin, abs($ahead - $burst * $interval) * 1000;
    $tat{$k} = ($ahead ? $tat{$k} : $t) + $interval if $ahead <= $burst * $interval;
}

my $n = @trace;
my @same = grep { $ngx[$_] == $at[$_] } 0 .. $#trace;
my @diff = grep { $ngx[$_] != $at[$_] } 0 .. $#trace;
my $refused = grep { $_ == 503 } @ngx;
t_debug(sprintf "seed %d: %d requests in %.1f s (the client ended %.3f s late); nginx "
        . "refused %d, httpd %d", $seed, $n, $trace[-1][0], $late, $refused,
        scalar grep { $_ == 503 } @at);
for my $i (@diff) {
    t_debug(sprintf "differs: %.4f s key %s nginx %d httpd %d, %.1f ms from the edge",
            $trace[$i][0], $trace[$i][1] || '-', $ngx[$i], $at[$i], $margin[$i]);
}
ok t_cmp(scalar(grep { $_ != 200 && $_ != 503 } @ngx, @at), 0,
         'every answer from both is 200 or 503');
ok t_cmp($refused >= $n / 5 && $refused <= $n * 4 / 5, 1,
         "the trace is beyond the rate often enough to tell ($refused of $n refused)");
ok t_cmp(@same / $n >= 0.99, 1, sprintf('the same decision for %.2f %% of %d requests '
         . '(seed %d)', 100 * @same / $n, $n, $seed));
my @keyless = grep { $trace[$_][1] eq '' } 0 .. $#trace;
ok t_cmp(join('', map { $at[$_] } @keyless) =~ /^(200)+$/ ? 1 : 0, 1,
         'requests without a key are never refused (nginx: not accounted)');
ok t_cmp(join('', map { $ngx[$_] } @keyless) =~ /^(200)+$/ ? 1 : 0, 1, 'nor by nginx');
t_debug(sprintf '%d of the %d differences within 5 ms of the edge (by the trace\'s times)',
                scalar(grep { $margin[$_] < 5 } @diff), scalar @diff);
$srv->{stop}->();
