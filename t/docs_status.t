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
use JSON::PP ();
use lib 't/lib';
use ThrottleT;

my $doc = Apache::Test::vars('serverroot') . '/../docs-copy/docs/status.md';
plan tests => 6, need { 'run by t/run-apache-tests (needs the docs copy)' => -f $doc };

# a reference an administrator reads through, not a dump: at most 12 KB
my $size = -s $doc;
ok t_cmp($size <= 12 * 1024 ? 1 : 0, 1, "docs/status.md is $size bytes, at most 12 KB");

open my $fh, '<', $doc or die "$doc: $!";
my $text = do { local $/; <$fh> };
close $fh;
my $full = $text;
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
    $key =~ s/^Priority\.-?\d+\.//; # priorities go below 0
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

# LimitMaxFrom says where max came from, in words the reference gives; a
# fixed zone's max is its limit (it read "max=", as if given).
my @words = map { [$_->{limit_auto} ? 1 : 0, $_->{limit_max_from}] }
    @{ JSON::PP::decode_json($json)->{zones} };
my ($row) = $full =~ /^(\| `LimitMaxFrom`.*)$/m;
my @bad = map { "$_->[1] (limit_auto $_->[0])" }
    grep { (!$_->[0] && $_->[1] ne 'limit=') || ($row // '') !~ /`\Q$_->[1]\E`/ } @words;
ok t_cmp("@bad", '', 'LimitMaxFrom: limit= for a fixed zone, and every word in docs/status.md (' . @words . ' zones)');

# A sample that leaves histogram buckets out says so.
my ($prom_sample) = $full =~ /<!-- sample: prometheus -->\n```\w*\n(.*?)```/s;
my $live = GET_BODY('/throttle-status?prometheus');
my @quiet;
for my $h ($prom_sample =~ /^# TYPE apache_throttle_(\w+) histogram/mg) {
    my $shown = () = $prom_sample =~ /^apache_throttle_${h}_bucket\{/mg;
    my ($zone) = $live =~ /^apache_throttle_${h}_bucket\{zone="([^"]+)"/m;
    my $all = () = $live =~ /^apache_throttle_${h}_bucket\{zone="\Q$zone\E"/mg;
    push @quiet, "$h: $shown of $all buckets, unsaid"
        if $shown < $all && $prom_sample !~ /^# \(this sample keeps $shown of the \d+ buckets/m;
}
ok t_cmp("@quiet", '', 'the Prometheus sample says which histogram buckets it leaves out');
