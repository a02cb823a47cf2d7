#!/usr/bin/perl
# Reads the request body to its end and describes it: how many bytes and
# their MD5, so a test can tell that the body arrived byte for byte.
use strict;
use warnings;
use Digest::MD5;

binmode STDIN;
my $md5 = Digest::MD5->new;
my ($len, $buf) = (0, '');
while (my $n = read(STDIN, $buf, 65536)) {
    $len += $n;
    $md5->add($buf);
}
print "Content-Type: text/plain\n\n";
printf "len=%d md5=%s content_length=%s result=%s\n", $len, $md5->hexdigest,
    $ENV{CONTENT_LENGTH} // '-', $ENV{THROTTLE_RESULT} // '';
