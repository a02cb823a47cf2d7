#!/usr/bin/perl -w
# probe.cgi as an nph- script: httpd passes its output, status line and
# all, straight to the client.
use strict;
use warnings;
use FindBin;
do "$FindBin::Bin/probe.cgi" or die $@ || $!;
