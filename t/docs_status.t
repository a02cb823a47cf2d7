# docs/status.md's reference names every key and metric the status page
# shows, in each format: what the module adds, the reference must say.
# A JSON member or metric that follows the naming rule of the reference
# (the key in snake_case; counters with _total; milliseconds as seconds)
# counts as named by its key.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use Apache::TestRequest qw(GET_BODY);
use lib 't/lib';
use ThrottleT;

my $doc = Apache::Test::vars('serverroot') . '/../docs-copy/docs/status.md';
plan tests => 4, need { 'run by t/run-apache-tests (needs the docs copy)' => -f $doc };

# a reference an administrator reads through, not a dump: at most 12 KB
my $size = -s $doc;
ok t_cmp($size <= 12 * 1024 ? 1 : 0, 1, "docs/status.md is $size bytes, at most 12 KB");

open my $fh, '<', $doc or die "$doc: $!";
my $text = do { local $/; <$fh> };
close $fh;
$text =~ s/<!-- sample: \w+ -->\n```\w*\n.*?```\n//gs; # the samples name nothing
my %named = map { $_ => 1 } map { /\b([A-Za-z][A-Za-z0-9_]*)\b/g } $text =~ /`([^`]+)`/g;
sub snake { (my $k = shift) =~ s/([a-z0-9])([A-Z])/$1_$2/g; lc $k }
my %by_rule;
for my $k (grep { /^[A-Z]/ } keys %named) {
    my $s = snake($k);
    $by_rule{$_} = 1 for $s, "${s}_total", $s =~ s/_ms$/_seconds/r;
}
sub missing { sort grep { !$named{$_} && !$by_rule{$_} } @_ }

# ?auto: Throttle.<zone>.<Key>, Priority.<N>.<Key>, the server's keys
my (%auto, %prom, %json);
for (split /\n/, GET_BODY('/throttle-status?auto')) {
    my ($key) = /^([^:]+):/ or next;
    $key =~ s/^Throttle\.[^.]+\.//;
    $key =~ s/^Priority\.\d+\.//;
    $key =~ s/^ThrottleChild\.\d+\.//;
    $auto{$key} = 1;
}
my @m = missing(keys %auto);
ok t_cmp("@m", '', 'every ?auto key is in docs/status.md (' . keys(%auto) . ' keys)');

for (split /\n/, GET_BODY('/throttle-status?prometheus')) {
    $prom{$1} = 1 if /^# TYPE apache_throttle_(\w+) /;
}
@m = missing(keys %prom);
ok t_cmp("@m", '', 'every Prometheus metric is in docs/status.md (' . keys(%prom) . ' metrics)');

my $json = GET_BODY('/throttle-status?json');
$json{$1} = 1 while $json =~ /"(\w+)":/g;
@m = missing(keys %json);
ok t_cmp("@m", '', 'every JSON member is in docs/status.md (' . keys(%json) . ' members)');
