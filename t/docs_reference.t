# The reference and the guides agree with the module, and keep the shape
# an administrator reads:
# - docs/directives.md names every directive of the module (read from its
#   command table) and every ThrottleZone option (as the module lists them
#   in its own error message), directives first, each with its Syntax and
#   Default lines and at most two paragraphs; it is at most 20 KB;
# - every list of THROTTLE_RESULT values, and the troubleshooting table,
#   names every result the code can set (read from result_name() and the
#   other assignments in src/, so a result added there must be documented);
#   and no page names a result the code does not have;
# - every zone the docs show with rate_delay= gives a timeout longer than
#   the last delayed turn (else the burst is refused, not delayed);
# - the user's pages name no internal constant and no test file;
# - every relative link of README.md and docs/*.md reaches a file, and an
#   anchor that one of its headings makes.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use File::Find;
use lib 't/lib';
use ThrottleT;

my $top = Apache::Test::vars('serverroot') . '/../docs-copy';
plan tests => 12, need { 'run by t/run-apache-tests (needs the docs and src copy)' => -d "$top/src",
                         'INHERIT_CONF' => $ENV{INHERIT_CONF} };

sub slurp { my ($f) = @_; open my $fh, '<', $f or die "$f: $!"; local $/; <$fh> }
my @docs = ("$top/README.md", glob "$top/docs/*.md");
my %text = map { (my $n = $_) =~ s{^\Q$top\E/}{}; ($n => slurp($_)) } @docs;
my $ref = $text{'docs/directives.md'};

my @c_files;
find(sub { push @c_files, $File::Find::name if /\.c$/ }, "$top/src");
my $src = join "\n", map { slurp($_) } sort @c_files;

# ---- the reference's shape ---------------------------------------------
my $size = length $ref;
ok t_cmp($size <= 20 * 1024 ? 1 : 0, 1, "docs/directives.md is $size bytes, at most 20 KB");

my @directives = sort { $a cmp $b } do { my %d = map { $_ => 1 } $src =~ /AP_INIT_\w+\("(Throttle\w*)"/g; keys %d };
my ($keys) = configtest("ThrottleZone x limit=1 no_such_key=1\n") =~ /\(keys: ([^)]+)\)/;
my @options = split /,\s*/, $keys // '';
my (%heading, $n);
while ($ref =~ /^(#{2,3}) (.+)$/mg) {
    my ($level, $h) = ($1, $2);
    $n++;
    $heading{$_} //= [$level, $n] for ($h =~ /^(Throttle\w*)$/, $level eq '###' ? split /,\s*/, $h : ());
}
my @missing = grep { !$heading{$_} || $heading{$_}[0] ne '##' } @directives;
push @missing, grep { !$heading{$_} || $heading{$_}[0] ne '###' } @options;
ok t_cmp("@missing", '', scalar(@directives) . ' directives (## headings) and ' . scalar(@options)
         . ' ThrottleZone options (### headings) in docs/directives.md');
my ($last_directive) = sort { $b <=> $a } map { $heading{$_}[1] } grep { $heading{$_} } @directives;
my @early = grep { $heading{$_} && $heading{$_}[1] < $last_directive } @options;
ok t_cmp("@early", '', 'the directives come first, the options after');

# Each section: its table with Syntax and Default, then at most two paragraphs.
my @bad;
for my $sec (split /^(?=#{2,3} )/m, $ref) {
    my ($h) = $sec =~ /^#{2,3} (.+)$/m or next;
    next unless $h =~ /^Throttle\w*$/ || ($h !~ /\s/ || $h =~ /^\w+, \w+$/) && $h =~ /^[a-z]/;
    push @bad, "$h: no Syntax line" unless $sec =~ /^\| Syntax \|/m;
    push @bad, "$h: no Default line" unless $sec =~ /^\| Default \|/m;
    (my $prose = $sec) =~ s/^```.*?^```\n//msg;
    $prose =~ s/^(?:\||#|<!--).*\n//mg;
    my @paras = grep { /\S/ } split /\n\s*\n/, $prose;
    push @bad, "$h: " . scalar(@paras) . ' paragraphs' if @paras > 2;
}
ok t_cmp("@bad", '', 'every directive and option has Syntax and Default lines and at most two paragraphs');

# ---- THROTTLE_RESULT, from the code --------------------------------------
my ($fn) = $src =~ /\bresult_name\s*\([^)]*\)\s*\{(.*?)^\}/ms;
my %results = map { $_ => 1 } ($fn // '') =~ /return\s+"([a-z-]+)"/g;
$results{$_} = 1 for $src =~ /->result\s*=\s*"([a-z-]+)"/g;
my @results = sort keys %results;
ok t_cmp(scalar(@results) >= 15 && $results{admitted} && $results{bypass} ? 1 : 0, 1,
         scalar(@results) . " results read from the code (@results)");

my @lists;
for my $name (sort keys %text) {
    push @lists, map { ["$name: the THROTTLE_RESULT row", $_] } $text{$name} =~ /^\| `THROTTLE_RESULT` \|(.*)$/mg;
}
my ($by_result) = $text{'docs/operations.md'} =~ /^## By THROTTLE_RESULT\n(.*?)(?=^## )/ms;
push @lists, ['docs/operations.md: By THROTTLE_RESULT', $by_result // ''];
ok t_cmp(scalar(@lists) >= 2 ? 1 : 0, 1, scalar(@lists) . ' lists of results found');
my @gaps;
for my $l (@lists) {
    my @m = grep { $l->[1] !~ /`\Q$_\E`/ } @results;
    push @gaps, "$l->[0] lacks @m" if @m;
}
ok t_cmp(join('; ', @gaps), '', 'every list of THROTTLE_RESULT values names every result the code sets');
my %unknown;
for my $name (sort keys %text) {
    $unknown{"$name: $_"} = 1 for grep { !$results{$_} } $text{$name} =~ /`(rejected-[a-z-]+)`/g;
}
ok t_cmp(join('; ', sort keys %unknown), '', 'no page names a rejected-… result the code does not have');

# ---- rate_delay: the burst must fit in the timeout ----------------------
my @traps;
for my $name (sort keys %text) {
    for my $line ($text{$name} =~ /^\s*(ThrottleZone .*rate_delay=\d+.*)$/mg) {
        my ($r, $unit, $burst) = $line =~ m{rate=(\d+)r?/([sm])(?::(\d+))?} or next;
        my ($delay) = $line =~ /rate_delay=(\d+)/;
        my ($t, $tu) = $line =~ /timeout=(\d+)(ms|s|m|h)?\b/;
        my $timeout = defined $t ? $t * { ms => 0.001, s => 1, m => 60, h => 3600 }->{$tu // 's'} : 4;
        my $last = (($burst // 0) - $delay) * ($unit eq 'm' ? 60 : 1) / $r;
        push @traps, "$name: '$line': the last delayed turn is ${last}s, timeout ${timeout}s"
            if $last >= $timeout;
    }
}
ok t_cmp(join('; ', @traps), '', 'every zone shown with rate_delay= waits its burst within its timeout');

# ---- no internals on the user's pages --------------------------------------
my @internal;
for my $name (grep { !m{docs/(guarantees|adaptive-limit)\.md} } sort keys %text) {
    (my $t = $text{$name}) =~ s/^```(?!apache).*?^```\n//msg; # shell, samples
    push @internal, map { "$name: $_" }
        $t =~ /(\bAT_[A-Z_]+\b|\bWORTH_UP\b|\bNOISE_SES\b|\bt\/[\w\/-]+\.(?:t|c)\b|\btest_[a-z_]{4,}\b|held level|laid anew|barging|the queue stands)/g;
}
ok t_cmp(join('; ', @internal), '', 'no internal constant, test file or jargon on the user\'s pages');

# ---- links ---------------------------------------------------------------
sub slug { (my $s = lc shift) =~ s/[^\w\- ]//g; $s =~ s/ /-/g; $s }
my %anchors;
for my $name (keys %text) {
    (my $t = $text{$name}) =~ s/^```.*?^```\n//msg;
    $anchors{$name}{slug($1)} = 1 while $t =~ /^#+ (.+)$/mg;
}
my @broken;
for my $name (sort keys %text) {
    (my $dir = $name) =~ s{[^/]*$}{};
    (my $t = $text{$name}) =~ s/^```.*?^```\n//msg;
    while ($t =~ /\]\(([^)\s]+)\)/g) {
        my $link = $1;
        next if $link =~ m{^(https?|mailto):};
        my ($path, $anchor) = split /#/, $link, 2;
        my $target = $path eq '' ? $name : "$dir$path";
        1 while $target =~ s{[^/]+/\.\./}{};
        if ($path ne '' && !$text{$target}) {
            next if -e "$top/$target" || $target =~ m{^(?:CHANGES|conf/|CONTRIBUTING|LICENSE|docs/monitoring/)}
                 || $target =~ m{^docs/benchmarks};
            push @broken, "$name: $link";
        } elsif (defined $anchor && $text{$target} && !$anchors{$target}{$anchor}) {
            push @broken, "$name: $link";
        }
    }
}
ok t_cmp(join('; ', @broken), '', 'every link between README.md and docs/ reaches its file and heading');

my $readme = length $text{'README.md'};
ok t_cmp($readme <= 12 * 1024 ? 1 : 0, 1, "README.md is $readme bytes, at most 12 KB");
