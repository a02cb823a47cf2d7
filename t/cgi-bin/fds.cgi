#!/usr/bin/perl
# What a CGI inherits: the targets of its open file descriptors, one a
# line ("3 socket:[12345]"), for a test to look up the sockets among.
use strict;
use warnings;

print "Content-Type: text/plain\r\n\r\n";
opendir(my $d, '/proc/self/fd') or die "/proc/self/fd: $!";
for my $fd (sort { $a <=> $b } grep { /^\d+$/ } readdir $d) {
    my $target = readlink("/proc/self/fd/$fd") // next;
    print "$fd $target\n";
}
