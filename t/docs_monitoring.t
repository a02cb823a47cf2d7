# The alerting rules and the Grafana dashboard of docs/monitoring/ query
# only metrics the module exports: every apache_throttle_* name in them
# (histograms by their _bucket, _sum and _count) is on the status page's
# ?prometheus. promtool's own checks are scripts/check-monitoring's.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use Apache::TestRequest qw(GET_BODY);
use JSON::PP;

my $dir = Apache::Test::vars('serverroot') . '/../docs-copy/docs/monitoring';
plan tests => 3, need { 'run by t/run-apache-tests (needs the docs copy)' => -d $dir };

my %exported;
for (split /\n/, GET_BODY('/throttle-status?prometheus')) {
    $exported{$1} = 1 if /^(apache_throttle_\w+)[{ ]/;
}

sub slurp { my ($f) = @_; open my $fh, '<', "$dir/$f" or die "$dir/$f: $!"; local $/; <$fh> }
sub unknown {
    my %seen = map { $_ => 1 } $_[0] =~ /\b(apache_throttle_\w+)/g;
    return join ' ', sort grep { !$exported{$_} } keys %seen;
}

my $dash = decode_json(slurp('grafana-dashboard.json'));
my $exprs = join "\n", map { $_->{expr} } map { @{ $_->{targets} } } @{ $dash->{panels} };
$exprs .= "\n" . join "\n", map { $_->{query} // '' } @{ $dash->{templating}{list} };
ok t_cmp(unknown($exprs), '', 'every metric of the dashboard is exported');
ok t_cmp(unknown(slurp('alerts.yml')), '', 'every metric of the alerting rules is exported');
ok t_cmp(scalar(keys %exported) > 20, 1, scalar(keys %exported) . ' series names read');
