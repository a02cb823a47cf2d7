#!/usr/bin/perl
# Answers with a local Location and no Status: httpd then serves that URL
# itself, by an internal redirect.
my ($to) = ($ENV{QUERY_STRING} // '') =~ m{^to=(/[\w./-]+)$};
print "Location: ", $to // '/index.html', "\n\n";
