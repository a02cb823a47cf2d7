#!/usr/bin/perl
# ErrorDocument 503 target: shows that the module's 503 reaches it with the
# outcome in the environment.
print "Content-Type: text/plain\n\n";
printf "custom 503 page: zone=%s result=%s wait_us=%s\n",
    $ENV{REDIRECT_THROTTLE_ZONE} // '', $ENV{REDIRECT_THROTTLE_RESULT} // '',
    $ENV{REDIRECT_THROTTLE_WAIT_US} // '';
