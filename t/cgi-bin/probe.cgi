#!/usr/bin/perl -w
# A CGI that witnesses the throttle from the inside: under an exclusive lock
# it counts how many copies of itself run at once (per tag), remembers the
# highest count, logs the order in which copies started and the pid of the
# httpd process that runs it, then sleeps and answers. With release=1 it
# sleeps only until the test makes the file $tag.release (probe_release).
#
# Its shape, as real scripts have it: by default it prints its headers after
# its work; first=1 prints and flushes them before (as CGI.pm, shell and
# Python scripts do), big=KiB then writes that much body before working,
# more than a pipe holds; run as nph-probe.cgi it answers with its own
# status line, first.
use strict;
# Loaded, not imported, and warnings by -w: Exporter's tags and warnings.pm
# cost a quarter of a start's CPU, and the suite starts this thousands of
# times.
require Fcntl;
require Time::HiRes;

my %q = map { my ($k, $v) = split /=/, $_, 2; ($k => $v // '') }
        split /&/, $ENV{QUERY_STRING} // '';
my $tag   = ($q{tag} // '') =~ /^(\w+)$/ ? $1 : 'default';
my $id    = ($q{id}  // '') =~ /^(\w+)$/ ? $1 : '-';
my $ms    = ($q{sleep} // '') =~ /^(\d+)$/ ? $1 : 0;
my $dir   = $ENV{PROBE_DIR} or die "PROBE_DIR not set";
my $release = $q{release} ? "$dir/$tag.release" : undef;

sub with_count {
    my ($delta, $log) = @_;
    sysopen(my $fh, "$dir/$tag.count", Fcntl::O_RDWR() | Fcntl::O_CREAT()) or die "$dir/$tag.count: $!";
    flock($fh, Fcntl::LOCK_EX()) or die "flock: $!";
    my ($cur, $max) = split ' ', (<$fh> // '0 0');
    $cur = ($cur // 0) + $delta;
    $max = $cur if $cur > ($max // 0);
    seek($fh, 0, 0); truncate($fh, 0);
    print $fh "$cur $max\n";
    if ($log) {
        open(my $o, '>>', "$dir/$tag.order") or die;
        print $o "$id $$ ", getppid(), "\n";
        close $o;
    }
    # Every start and end with its time, to find out afterwards who ran at once.
    if (open(my $e, '>>', "$dir/$tag.events")) {
        printf $e "%s %.6f %d %d %d\n", $delta > 0 ? '+' : '-', Time::HiRes::time(), $$,
            getppid(), $cur;
        close $e;
    }
    close $fh;
}

# mem=MiB: the request takes that much memory while it runs, as seen by a
# memory cgroup laid out for the test (MEM_CURRENT names its memory.current).
my $mem = ($q{mem} // '') =~ /^(\d+)$/ ? $1 : 0;
sub take_memory {
    my ($mib) = @_;
    my $file = $ENV{MEM_CURRENT} or die "MEM_CURRENT not set";
    open(my $lk, '>>', "$file.lock") or die "$file.lock: $!";
    flock($lk, Fcntl::LOCK_EX()) or die "flock: $!";
    open(my $in, '<', $file) or die "$file: $!";
    my $cur = <$in> + $mib * 1048576;
    close $in;
    open(my $out, '>', "$file.$$") or die "$file.$$: $!";
    print $out "$cur\n";
    close $out;
    rename("$file.$$", $file) or die "rename: $!"; # readers never see half a file
    close $lk;
}

my $nph = $0 =~ m{(?:^|/)nph-[^/]*$};
my $first = $nph || ($q{first} // '') eq '1';
my $big = ($q{big} // '') =~ /^(\d+)$/ ? $1 : 0;
$| = 1;

with_count(+1, 1);
if ($first) {
    print "HTTP/1.0 200 OK\r\n" if $nph;
    print "Content-Type: text/plain\r\n\r\n";
    print 'x' x 1023, "\n" for 1 .. $big;
}
take_memory($mem) if $mem;
if ($release) {
    my $end = Time::HiRes::time() + $ms / 1000;
    Time::HiRes::sleep(0.01) while !-e $release && Time::HiRes::time() < $end;
}
elsif ($ms) {
    Time::HiRes::sleep($ms / 1000);
}
# The count ends before the last line: a client that has the whole answer
# finds this copy no longer counted. It ends before the memory is given
# back, so that a request admitted on that memory is never counted beside it.
with_count(-1, 0);
take_memory(-$mem) if $mem;

print "Content-Type: text/plain\n\n" unless $first;
printf "zone=%s result=%s wait_us=%s id=%s httpd_pid=%d priority=%s key=%s\n",
    $ENV{THROTTLE_ZONE} // '', $ENV{THROTTLE_RESULT} // '',
    $ENV{THROTTLE_WAIT_US} // '', $id, getppid(), $ENV{THROTTLE_PRIORITY} // '',
    $ENV{THROTTLE_KEY} // '';
