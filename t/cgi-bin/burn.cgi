#!/usr/bin/perl
# Burns about ms=N milliseconds of CPU (default 50), then answers.
use strict;
use warnings;
my ($ms) = ($ENV{QUERY_STRING} // '') =~ /ms=(\d+)/;
$ms //= 50;
my $end = (times)[0] + (times)[1] + $ms / 1000;
my $x = 0;
while ((times)[0] + (times)[1] < $end) {
    $x += $_ for 1 .. 1000;
}
print "Content-Type: text/plain\n\n";
printf "burned %d ms result=%s\n", $ms, $ENV{THROTTLE_RESULT} // '';
