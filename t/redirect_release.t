# A throttled CGI answers with a local Location (zone redir, limit=1): httpd
# serves the new URL by an internal redirect, a 32 MiB file here. The slot
# goes back once that response has passed the filters, even while the
# client has not read it; a request after it is admitted at once.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use lib 't/lib';
use ThrottleT;
use Time::HiRes qw(time sleep);

plan tests => 3, need_cgi;

my $docroot = Apache::Test::vars('documentroot');
open my $fh, '>', "$docroot/big.bin" or die "$docroot/big.bin: $!";
print $fh "z" x (1 << 20) for 1 .. 32;
close $fh;
chmod 0644, "$docroot/big.bin";

# Ask, read the status line and stop reading: the server is left with most
# of the 32 MiB to write.
my $sock = open_request('/redir/redirect.cgi?to=/big.bin');
my $line = <$sock>;
ok t_cmp($line, qr{^HTTP/1\.\d 200}, 'the CGI\'s Location was served internally');
my $freed = wait_until(sub { status_auto()->{'Throttle.redir.Active'} == 0 }, 3);
ok t_cmp($freed, 1, 'the slot went back while the client had not read the response');
my $next = http_get('/redir/probe.cgi?tag=redir');
ok t_cmp($next->{status}, 200, 'the next request is admitted meanwhile');
close $sock;
unlink "$docroot/big.bin";
