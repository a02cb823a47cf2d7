# Every configuration the documentation shows passes httpd -t when an
# administrator pastes it into a server: each ```apache block of README.md
# and docs/*.md, with the suite's modules loaded.
#
# A block that is a fragment on purpose says so in an HTML comment on the
# line above its fence, with clauses separated by "|":
#   <!-- fragment; needs: ThrottleZone app limit=8; ThrottleZone b limit=2 -->
#     pastes those lines (separated by ";") ahead of the block;
#   <!-- fragment; mpm: prefork -->
#     checks it only under that MPM;
#   <!-- fragment; untested: REASON -->
#     leaves it out, with the reason printed.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;

my $top = Apache::Test::vars('serverroot') . '/../docs-copy';
my @files = grep { -f } ("$top/README.md", glob "$top/docs/*.md");

# [file:line, text, what to paste first or undef to leave out, reason]
sub blocks_of {
    my ($file) = @_;
    open my $in, '<', $file or die "$file: $!";
    my (@found, $block, $prev);
    (my $name = $file) =~ s{^\Q$top\E/}{};
    while (my $line = <$in>) {
        if (!defined $block && $line =~ /^```apache\s*$/) {
            $block = { where => "$name:$.", text => '', before => '' };
            my ($clauses) = ($prev // '') =~ /^<!--\s*fragment;\s*(.*?)\s*-->/;
            for (split /\s*\|\s*/, $clauses // '') {
                my ($k, $v) = /^(needs|mpm|untested):\s*(.*)$/ or die "$name:$.: bad marker '$_'";
                $block->{before} = join '', map { "$_\n" } split /\s*;\s*/, $v if $k eq 'needs';
                $block->{untested} = $v if $k eq 'untested';
                $block->{untested} = "$v only" if $k eq 'mpm' && $v ne ($ENV{MPM} // '');
            }
        } elsif (defined $block && $line =~ /^```\s*$/) {
            push @found, $block;
            undef $block;
        } elsif (defined $block) {
            $block->{text} .= $line;
        }
        $prev = $line;
    }
    return @found;
}

my @blocks = map { blocks_of($_) } @files;
plan tests => 1 + @blocks, need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => $ENV{INHERIT_CONF},
                                  'README.md and docs/ copied beside the suite' => -d "$top/docs" };

# A suite that found nothing to check would pass without checking.
ok t_cmp(scalar(@blocks) >= 15 ? 'found' : scalar(@blocks) . ' blocks', 'found',
         'README.md and docs/ hold the apache blocks this test checks');
for my $b (@blocks) {
    if (defined $b->{untested}) {
        skip "$b->{where}: a fragment, untested: $b->{untested}";
        next;
    }
    my $err = configtest($b->{before} . $b->{text});
    print STDERR "# $b->{where}: $err" if $err;
    ok t_cmp($err, '', "$b->{where} passes httpd -t as pasted");
}
