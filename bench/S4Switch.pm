# How fast limit=auto settles after each change of workload in S4's switch
# (bench/s4-lib.sh's s4_switch), and what a load run got done: shared by
# bench/s4-report and bench/s4-switch-report.
package S4Switch;
use strict;
use warnings;
use Exporter 'import';
our @EXPORT_OK = qw(@PHASES $WARM load_stats median read_switch settling settling_cells
                    sleep_handler sleep_tag);

# The sleep-bound handler bench/s4-lib.sh ran (S4_SLEEP), as the reports
# describe it, and the tag their file names get for it.
sub proxied {
    return ($ENV{S4_SLEEP} // 'cgi') eq 'proxy';
}

sub sleep_handler {
    return proxied()
        ? 'a backend waiting 200 ms behind mod_proxy_http (bench/sleep-backend.c; no fork a request)'
        : 'a CGI sleeping 200 ms';
}

sub sleep_tag {
    return proxied() ? '-proxy' : '';
}

# The switch's phases, in order.
our @PHASES = ('CPU', 'sleep', 'CPU again');

sub median {
    my @v = sort { $a <=> $b } @_;
    return 0 unless @v;
    return @v % 2 ? $v[$#v / 2] : ($v[@v / 2 - 1] + $v[@v / 2]) / 2;
}

sub pct {
    my ($q, @v) = @_;
    @v = sort { $a <=> $b } @v;
    return 0 unless @v;
    return $v[int($q * $#v + 0.5)];
}

# Whole run, and from WARM s on: a fixed limit runs at its level from the
# first request, limit=auto first has to find it.
our $WARM = 10;

# A load run's file (start_us end_us status) of SECS seconds: goodput /s,
# p99 ms, answers not 200, and goodput and p99 of the requests sent from
# $WARM s on.
sub load_stats {
    my ($f, $secs) = @_;
    open my $fh, '<', $f or return;
    my ($ok, $bad, $ok_late, @lat, @lat_late) = (0, 0, 0);
    while (<$fh>) {
        next if /^#/;
        my ($s, $e, $st) = split;
        if ($st != 200) { $bad++; next }
        $ok++;
        push @lat, ($e - $s) / 1000;
        if ($s >= $WARM * 1e6) { $ok_late++; push @lat_late, ($e - $s) / 1000 }
    }
    return ($ok / $secs, pct(0.99, @lat), $bad, $ok_late / ($secs - $WARM),
            pct(0.99, @lat_late));
}

# The phases' starts (seconds from the first; the end last) and the
# samples [t, limit, held level] of a switch run's directory.
sub read_switch {
    my ($dir) = @_;
    open my $f, '<', "$dir/switch-t0" or die "$dir/switch-t0: $!";
    my @starts = map { $_ + 0 } grep { /\S/ } <$f>;
    my $t0 = $starts[0];
    @starts = map { $_ - $t0 } @starts;
    my @samples;
    if (open my $s, '<', "$dir/switch-limit") {
        while (<$s>) {
            my ($t, $l, $h) = split;
            push @samples, [$t - $t0, $l, $h // $l] if defined $l && $l ne '' && $t >= $t0;
        }
    }
    return (\@starts, \@samples);
}

# Settled: from a time on, the limit stays within ±25 % (at least ±1) of the
# median of the phase's last 10 s; counted on the limit itself, on its
# running median over 2 s, which keeps levels but drops most of a probe's
# single window a step away, and on the level the controller holds (the one
# a probe goes back to, LimitHeld on the status page), which leaves probes
# out.
sub settled_after {
    my ($final, $from, @in) = @_;
    my $tol = 0.25 * $final < 1 ? 1 : 0.25 * $final;
    my $since;
    for my $s (@in) {
        $since = abs($s->[1] - $final) <= $tol ? ($since // $s->[0]) : undef;
    }
    return defined $since ? $since - $from : undef;
}

# How much of the time from 10 s on the limit itself spends within ±25 % of
# the held level's final median, and its range: a probe's excursions are
# brief or not, which the settled times alone do not tell. Undef when the
# phase was shorter than 10 s.
sub share_near {
    my ($final, @in) = @_;
    my $tol = 0.25 * $final < 1 ? 1 : 0.25 * $final;
    my @l = map { $_->[1] } @in;
    return undef unless @l;
    my ($lo, $hi) = (sort { $a <=> $b } @l)[0, -1];
    return [scalar(grep { abs($_ - $final) <= $tol } @l) / @l, $lo, $hi];
}

# Per phase (0: CPU, 1: sleep, 2: CPU again): [phase, final limit, limit
# settled after, running median settled after, final held level, held level
# settled after, share_near from 10 s on]; times in seconds from the
# phase's start, undef for never.
sub settling {
    my ($starts, $samples, $switch) = @_;
    my @settle;
    for my $phase (0 .. 2) {
        my ($from, $to) = ($starts->[$phase], $starts->[$phase + 1] // $switch * ($phase + 1));
        my @in = grep { $_->[0] >= $from && $_->[0] < $to } @$samples;
        my @late = grep { $_->[0] >= $to - 10 } @in;
        my $final = median(map { $_->[1] } @late);
        my $final_held = median(map { $_->[2] } @late);
        my @smooth = map {
            my $t = $_->[0];
            [$t, median(map { $_->[1] } grep { abs($_->[0] - $t) <= 1 } @in)]
        } @in;
        my @held = map { [$_->[0], $_->[2]] } @in;
        push @settle, [$phase, $final, settled_after($final, $from, @in),
                       settled_after($final, $from, @smooth), $final_held,
                       settled_after($final_held, $from, @held),
                       share_near($final_held, grep { $_->[0] >= $from + 10 } @in)];
    }
    return \@settle;
}

# One phase of settling() as the reports' table cells: phase, settled
# limit, after, running median after, held level, after, share near, range.
sub settling_cells {
    my ($phase, $final, $lim, $med, $held, $held_after, $near) = @{ $_[0] };
    my $secs = sub { defined $_[0] ? sprintf('%.1f', $_[0]) : 'never' };
    return ($PHASES[$phase], $final, $secs->($lim), $secs->($med),
            $held, $secs->($held_after),
            $near ? (sprintf('%.0f %%', 100 * $near->[0]), "$near->[1] – $near->[2]")
                  : ('–', '–'));
}

1;
