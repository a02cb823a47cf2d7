# The status page in its four formats: each parses, and its numbers move
# exactly as the test itself made them move. mod_status gets a section.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time sleep);
use JSON::PP;

plan tests => 30, need_cgi;

sub json_zone {
    my ($name) = @_;
    my $doc = decode_json(http_get('/throttle-status?json')->{body});
    my ($z) = grep { $_->{name} eq $name } @{ $doc->{zones} };
    return ($doc, $z);
}

# Prometheus text format 0.0.4, checked line by line. Returns the samples
# as { "name{labels}" => value } and a list of grammar faults.
sub parse_prometheus {
    my ($text) = @_;
    my (%samples, %type, %help, @faults, %last_bucket, %inf);
    my $name_re = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
    for my $line (split /\n/, $text) {
        if ($line =~ /^# HELP ($name_re) \S/) {
            push @faults, "second HELP for $1" if $help{$1}++;
        }
        elsif ($line =~ /^# TYPE ($name_re) (counter|gauge|histogram|summary|untyped)$/) {
            push @faults, "second TYPE for $1" if $type{$1};
            $type{$1} = $2;
        }
        elsif ($line =~ /^($name_re)(\{(?:[a-zA-Z_]\w*="[^"\\]*"(?:,[a-zA-Z_]\w*="[^"\\]*")*)?\})? (\S+)$/) {
            my ($name, $labels, $value) = ($1, $2 // '', $3);
            push @faults, "bad value in: $line"
                unless $value =~ /^[-+]?(\d+\.?\d*([eE][-+]?\d+)?|Inf|NaN)$/;
            push @faults, "no apache_throttle_ prefix: $name" unless $name =~ /^apache_throttle_/;
            (my $family = $name) =~ s/_(bucket|sum|count)$// if !$type{$name};
            $family //= $name;
            my $t = $type{$name} // $type{$family};
            push @faults, "sample before its TYPE: $name" unless $t;
            push @faults, "counter not ending in _total: $name"
                if $t && $t eq 'counter' && $name !~ /_total$/;
            if ($name =~ /_bucket$/) {
                my ($le) = $labels =~ /le="([^"]+)"/;
                push @faults, "le label not canonical: $le"
                    unless $le =~ /^(\+Inf|\d+(\.\d+)?(e[-+]?\d+)?)$/;
                (my $series = $labels) =~ s/,?le="[^"]+"//;
                push @faults, "bucket not monotonic: $line"
                    if defined $last_bucket{"$name$series"} && $value < $last_bucket{"$name$series"};
                $last_bucket{"$name$series"} = $value;
                $inf{"$family$series"} = $value if $le eq '+Inf';
            }
            $samples{"$name$labels"} = $value;
        }
        elsif ($line ne '') {
            push @faults, "not a valid line: $line";
        }
    }
    for my $series (keys %last_bucket) {
        (my $fam = $series) =~ s/_bucket\{/{/;
        push @faults, "no +Inf bucket ending $series" unless exists $inf{$fam};
    }
    for my $series (keys %inf) {
        (my $count = $series) =~ s/^(\w+)\{/$1_count{/;
        push @faults, "count differs from +Inf bucket for $series"
            unless defined $samples{$count} && $samples{$count} == $inf{$series};
    }
    return (\%samples, \@faults);
}

# Baseline, then exactly 7 rejections for a full zone, and 1 admission.
my $a0 = status_auto();
my (undef, $j0) = json_zone('count7');
my ($p0) = parse_prometheus(http_get('/throttle-status?prometheus')->{body});

# The holder runs 1.2 s at least, and on until the 7 have their answers.
probe_reset('c7');
my $hold = bg_get('/count7/probe.cgi?tag=c7&sleep=60000&release=1&id=hold');
wait_until(sub { (probe_count('c7'))[0] == 1 }) or die 'holder never started';
my $held_from = time;
my @r = map { http_get("/count7/probe.cgi?tag=c7&id=r$_") } 1 .. 7;
ok t_cmp(scalar(grep { $_->{status} == 503 } @r), 7, 'the test caused 7 rejections');
my $left = 1.2 - (time - $held_from);
sleep $left if $left > 0;
probe_release('c7');
bg_wait($hold);

my $a1 = status_auto();
my ($doc, $j1) = json_zone('count7');
my $prom = http_get('/throttle-status?prometheus');
my ($p1, $faults) = parse_prometheus($prom->{body});

ok t_cmp($a1->{'Throttle.count7.RejectedFull'} - $a0->{'Throttle.count7.RejectedFull'}, 7,
         '?auto: RejectedFull rose by exactly 7');
ok t_cmp($a1->{'Throttle.count7.Admitted'} - $a0->{'Throttle.count7.Admitted'}, 1,
         '?auto: Admitted rose by exactly 1');
ok t_cmp($a1->{'Throttle.count7.ServiceSamples'} - ($a0->{'Throttle.count7.ServiceSamples'} // 0), 1,
         '?auto: one more service-time sample');
ok t_cmp($a1->{'Throttle.count7.ServiceP50Ms'} >= 1000 && $a1->{'Throttle.count7.ServiceP50Ms'} < 5000, 1,
         "?auto: service p50 ($a1->{'Throttle.count7.ServiceP50Ms'} ms) near the CGI's 1.2 s");
ok t_cmp("$a1->{'Throttle.count7.Limit'} $a1->{'Throttle.count7.QueueCapacity'} $a1->{'Throttle.count7.Active'}",
         '1 0 0', '?auto: limit, queue capacity, active');
ok t_cmp($a1->{ThrottleMPM}, qr/^(prefork|worker|event)$/, '?auto: MPM named');
# A Prometheus scrape's params give ?prometheus=, with an empty value.
my $scraped = http_get('/throttle-status?prometheus=');
ok t_cmp($scraped->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4},
         '?prometheus= is the Prometheus format too');
ok t_cmp($scraped->{body}, qr/^apache_throttle_limit\{zone="count7"\} 1$/m,
         '?prometheus= carries the zones');
ok t_cmp($a1->{ThrottleZones}, qr/\bcount7\b/, '?auto: zone listed');

ok t_cmp($doc->{version}, qr/^\d+\.\d+\.\d+$/, 'JSON: version');
ok t_cmp(ref $doc->{zones}, 'ARRAY', 'JSON: zones is an array');
ok t_cmp($j1->{rejected_full} - $j0->{rejected_full}, 7, 'JSON: rejected_full rose by exactly 7');
ok t_cmp($j1->{admitted} - $j0->{admitted}, 1, 'JSON: admitted rose by exactly 1');
ok t_cmp(JSON::PP::is_bool($j1->{dry_run}) && !$j1->{dry_run}, 1, 'JSON: dry_run is a false boolean');
ok t_cmp(join(',', map { exists $j1->{$_} ? 1 : 0 }
              qw(limit limit_min limit_max active queued queue_capacity timeout_ms
                 admitted queued_total rejected_full rejected_timeout rejected_predicted
                 aborted reclaimed wait_p50_ms wait_p90_ms wait_p99_ms service_p50_ms
                 service_p90_ms service_p99_ms oldest_running_ms)),
         join(',', (1) x 21), 'JSON: every documented member present');

ok t_cmp($prom->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4}, 'Prometheus content type');
ok t_cmp(join("\n", @$faults), '', 'Prometheus text follows the format grammar');
my $rf = 'apache_throttle_rejected_total{zone="count7",reason="full"}';
ok t_cmp($p1->{$rf} - $p0->{$rf}, 7, 'Prometheus: rejected_total{reason="full"} rose by exactly 7');
my $sc = 'apache_throttle_service_seconds_count{zone="count7"}';
ok t_cmp($p1->{$sc} - ($p0->{$sc} // 0), 1, 'Prometheus: service histogram count rose by 1');
ok t_cmp($p1->{'apache_throttle_service_seconds_bucket{zone="count7",le="1"}'}
         - ($p0->{'apache_throttle_service_seconds_bucket{zone="count7",le="1"}'} // 0), 0,
         'Prometheus: the 1.2 s request is not in the le="1" bucket');
ok t_cmp($p1->{'apache_throttle_service_seconds_bucket{zone="count7",le="2.5"}'}
         - ($p0->{'apache_throttle_service_seconds_bucket{zone="count7",le="2.5"}'} // 0), 1,
         '... but is in le="2.5"');
ok t_cmp($p1->{'apache_throttle_limit{zone="count7"}'}, 1, 'Prometheus: limit gauge');

my $html = http_get('/throttle-status');
ok t_cmp($html->{headers}{'content-type'}, qr{^text/html}, 'HTML by default');
ok t_cmp($html->{body}, qr{<table.*<th>count7</th>.*RejectedFull}s, 'HTML table with the zone');
ok t_cmp($html->{body} =~ /<script/i ? 1 : 0, 0, 'no JavaScript');

SKIP: {
    skip 'mod_status not loaded', 4 unless need_module('status');
    my $ss = http_get('/server-status');
    ok t_cmp($ss->{status}, 200, 'server-status answers');
    ok t_cmp($ss->{body}, qr{Throttle zones.*<th>count7</th>}s, 'server-status has a throttle section');
    my $sa = http_get('/server-status?auto');
    ok t_cmp($sa->{body}, qr{^Throttle\.count7\.Limit: 1$}m, 'server-status?auto has throttle lines');
    ok t_cmp($sa->{body}, qr{^Total Accesses: \d+}m, '... next to its own');
}
