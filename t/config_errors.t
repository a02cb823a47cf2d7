# Every invalid use of the directives stops httpd at configuration time
# (httpd -t fails), with a message that names the directive and the value.
use strict;
use warnings FATAL => 'all';
use Apache::Test;
use Apache::TestUtil;
use File::Temp qw(tempdir);

my @bad = (
    # [ configuration, what the message must mention ]
    ['ThrottleZone',                              qr/ThrottleZone.*name/],
    ['ThrottleZone web',                          qr/ThrottleZone web: .*'limit' is required/],
    ['ThrottleZone web limit=0',                  qr/ThrottleZone web: .*limit.*'0'.*out of range/],
    ['ThrottleZone web limit=-3',                 qr/ThrottleZone web: .*limit.*'-3'/],
    ['ThrottleZone web limit=abc',                qr/ThrottleZone web: .*limit.*'abc'/],
    ['ThrottleZone web limit=1.5',                qr/ThrottleZone web: .*limit.*'1\.5'/],
    ['ThrottleZone web limit=99999999999999999999',qr/ThrottleZone web: .*limit.*'99999999999999999999'/],
    ['ThrottleZone web limit=2 min=1',           qr/ThrottleZone web: the keys 'min' and 'max' go with limit=auto/],
    ['ThrottleZone web limit=auto min=8 max=2',   qr/ThrottleZone web: min \(8\) is greater than max \(2\)/],
    ['ThrottleZone web limit=auto max=0',         qr/ThrottleZone web: .*max.*'0'/],
    ['ThrottleZone web limit=2 queue=-1',         qr/ThrottleZone web: .*queue.*'-1'/],
    ['ThrottleZone web limit=2 queue=1000000',    qr/ThrottleZone web: .*queue.*'1000000'/],
    ['ThrottleZone web limit=2 queue=',           qr/ThrottleZone web: .*queue.*empty/],
    ['ThrottleZone web limit=2 timeout=0',        qr/ThrottleZone web: .*timeout.*'0'/],
    ['ThrottleZone web limit=2 timeout=5parsecs', qr/ThrottleZone web: .*timeout.*'5parsecs'.*unit/],
    ['ThrottleZone web limit=2 timeout=2h',       qr/ThrottleZone web: .*timeout.*'2h'/],
    ['ThrottleZone web limit=2 timeout=-1s',      qr/ThrottleZone web: .*timeout.*'-1s'/],
    ['ThrottleZone web limit=2 retry_after=0',    qr/ThrottleZone web: .*retry_after.*'0'/],
    ['ThrottleZone web limit=2 retry_after=soon', qr/ThrottleZone web: .*retry_after.*'soon'/],
    ['ThrottleZone web limit=2 dry_run=maybe',    qr/ThrottleZone web: .*dry_run.*'maybe' is neither on nor off/],
    ['ThrottleZone web limit=2 mem=0',            qr/ThrottleZone web: .*mem.*'0' is not a size/],
    ['ThrottleZone web limit=2 mem=200Q',         qr/ThrottleZone web: .*mem.*'200Q' has an unknown unit 'Q'/],
    ['ThrottleZone web limit=2 mem=lots',         qr/ThrottleZone web: .*mem.*'lots' is not a size/],
    ['ThrottleZone web limit=2 per_client=0',     qr/ThrottleZone web: .*per_client.*'0'.*out of range/],
    ['ThrottleZone web limit=2 per_client=-2',    qr/ThrottleZone web: .*per_client.*'-2'/],
    ['ThrottleZone web limit=2 per_client=few',   qr/ThrottleZone web: .*per_client.*'few'/],
    ['ThrottleZone web limit=2 per_client=4294967297', qr/ThrottleZone web: .*per_client.*'4294967297'/],
    ['ThrottleZone web limit=2 per_key=2',        qr/ThrottleZone web: per_key=N counts requests per key: name the key with key=EXPR/],
    ['ThrottleZone web limit=2 key=%{REMOTE_USER}', qr/ThrottleZone web: key= names what per_key and rate= count by: give per_key=N or rate=R\/s too/],
    ['ThrottleZone web limit=2 per_client=1 rate=5/s key=%{REMOTE_USER}', qr/ThrottleZone web: per_client counts addresses, and with key= requests count by key/],
    ['ThrottleZone web limit=2 rate=5',           qr/ThrottleZone web: key 'rate' has a bad value: '5' is not a rate: R\/s or R\/m/],
    ['ThrottleZone web limit=2 rate=5/h',         qr/ThrottleZone web: key 'rate' has a bad value: .*per second \(\/s\) or per minute/],
    ['ThrottleZone web limit=2 rate=5/s:2 rate_delay=3', qr/ThrottleZone web: rate_delay=3 is more than the burst \(2\)/],
    ['ThrottleZone web limit=2 rate_delay=1',     qr/ThrottleZone web: rate_delay=N holds back requests beyond a rate: give rate=R\/s:BURST too/],
    ['ThrottleZone web limit=2 per_key=0 key=%{REMOTE_USER}', qr/ThrottleZone web: .*per_key.*'0'.*out of range/],
    ['ThrottleZone web limit=2 per_key=1 key=%{HTTP:X-Api-Key',  qr/ThrottleZone web: key 'key' has a bad value: .*%\{HTTP:X-Api-Key\}/],
    ['ThrottleZone web limit=2 per_key=1 key=a key=b', qr/ThrottleZone web: key 'key' is given twice/],
    ['ThrottleZone web limit=2 per_key=1 key=',   qr/ThrottleZone web: key 'key' has an empty value/],
    ['ThrottleZone web limit=2 per_client=1 per_key=1 key=a', qr/ThrottleZone web: per_client and per_key count in the same table: give one of them/],
    ['ThrottleZone web limit=2 reserve=2',        qr/ThrottleZone web: reserve=2 leaves no slot .* less than limit \(2\)/],
    ['ThrottleZone web limit=2 reserve=x',        qr/ThrottleZone web: .*reserve.*'x'/],
    ['ThrottleZone web limit=2 codel=soon',       qr/ThrottleZone web: .*codel.*'soon'.*codel=TARGET/],
    ['ThrottleZone web limit=2 timeout=1s codel=2s', qr/ThrottleZone web: codel's target must be shorter than the timeout/],
    ['ThrottleZone web limit=2 order=lifo',       qr/ThrottleZone web: order=lifo serves the newest first while the queue stands, which codel= tells/],
    ['ThrottleZone web limit=2 codel=100ms order=last', qr/ThrottleZone web: key 'order' has a bad value: 'last' is neither fifo nor lifo/],
    ["<Location /x>\nThrottlePriority 11\n</Location>", qr/ThrottlePriority: '11' is not a priority: an integer from -10 to 10/],
    ["<Location /x>\nThrottlePriority high\n</Location>", qr/ThrottlePriority: 'high' is not a priority/],
    ["<Location /x>\nThrottlePriority 2 timeout=never\n</Location>", qr/ThrottlePriority: timeout: 'never'/],
    ["<Location /x>\nThrottlePriority 2 wait=1s\n</Location>", qr/ThrottlePriority: 'wait=1s' is not timeout=DURATION/],
    ['ThrottleZone web limit=2 bogus=1',          qr/ThrottleZone web: unknown key 'bogus'/],
    ['ThrottleZone web limit=2 limit=3',          qr/ThrottleZone web: key 'limit' is given twice/],
    ['ThrottleZone web limit=2 noequals',         qr/ThrottleZone web: 'noequals' is not of the form key=value/],
    ['ThrottleZone off limit=2',                  qr/ThrottleZone: 'off' is reserved/],
    ['ThrottleZone "we b" limit=2',               qr/ThrottleZone: zone name 'we b'/],
    ['ThrottleZone "" limit=2',                   qr/ThrottleZone: a zone name must not be empty/],
    ['ThrottleZone ' . ('x' x 49) . ' limit=2',   qr/ThrottleZone: zone name 'x{49}' is longer/],
    ["ThrottleZone web limit=2\nThrottleZone web limit=3", qr/ThrottleZone web: zone already defined at/],
    ["<VirtualHost 127.0.0.1:1>\nThrottleZone web limit=2\n</VirtualHost>", qr/ThrottleZone cannot occur within <VirtualHost>/],
    ["<Location /x>\nThrottleZone web limit=2\n</Location>", qr/ThrottleZone not allowed in <Location> context/],
    ["<Location /x>\nThrottle nowhere\n</Location>", qr/zone 'nowhere' is used at .* but never defined/],
    ['ThrottleHandler cgi-script nowhere',        qr/zone 'nowhere' is used at .* but never defined/],
    ['ThrottleHandler cgi-script',                qr/ThrottleHandler takes two arguments/],
    ["ThrottleZone web limit=2\nThrottleHandler \"\" web", qr/ThrottleHandler takes two arguments/],
    ["ThrottleZone web limit=2\nThrottleHandler cgi-script web\nThrottleHandler cgi-script web",
                                                  qr/ThrottleHandler cgi-script: this handler is already mapped to zone web/],
    ["ThrottleZone web limit=2\nThrottleHandler cgi-script \"a/b\"", qr/ThrottleHandler cgi-script: zone name 'a\/b'/],
    ["<Location /x>\nThrottleHandler cgi-script web\n</Location>", qr/ThrottleHandler not allowed in <Location> context/],
    ["<Location /x>\nThrottle a/b\n</Location>",  qr/Throttle: zone name 'a\/b'.*or 'off'/],
    ["<Location /x>\nThrottle\n</Location>",      qr/Throttle takes one argument/],
    ["<Location /x>\nThrottle a b\n</Location>",  qr/Throttle takes one argument/],
    ["<Location /x>\nThrottleBypass \"%{\"\n</Location>", qr/ThrottleBypass: cannot parse expression '%\{'/],
    ["<Location /x>\nThrottleBypass \"-R 'nonsense\"\n</Location>", qr/ThrottleBypass: cannot parse expression/],
    ['ThrottleChildLifetime 9 5',                 qr/ThrottleChildLifetime: MIN \(9\) is greater than MAX \(5\)/],
    ['ThrottleChildLifetime 0 5',                 qr/ThrottleChildLifetime: MIN '0' is out of range/],
    ['ThrottleChildLifetime -1 5',                qr/ThrottleChildLifetime: MIN '-1' is not a whole number/],
    ['ThrottleChildLifetime 5 x',                 qr/ThrottleChildLifetime: MAX 'x' is not a whole number/],
    ['ThrottleChildLifetime 1 99999999999',       qr/ThrottleChildLifetime: MAX '99999999999' is out of range/],
    ['ThrottleChildLifetime 5',                   qr/ThrottleChildLifetime takes two arguments/],
    ["ThrottleChildLifetime 5 9\nThrottleChildLifetime 5 9", qr/ThrottleChildLifetime: already set at/],
    ["<VirtualHost 127.0.0.1:1>\nThrottleChildLifetime 5 9\n</VirtualHost>", qr/ThrottleChildLifetime cannot occur within <VirtualHost>/],
    ['ThrottleChildMaxAge 0',                     qr/ThrottleChildMaxAge: '0' is not a duration/],
    ['ThrottleChildMaxAge 500ms',                 qr/ThrottleChildMaxAge: '500ms' is shorter than 1s/],
    ['ThrottleChildMaxAge 1h 10',                 qr/ThrottleChildMaxAge: jitter '10' must be a percentage/],
    ['ThrottleChildMaxAge 1h 95%',                qr/ThrottleChildMaxAge: jitter '95%'.*0% to 90%/],
    ['ThrottleChildMaxAge soon',                  qr/ThrottleChildMaxAge: 'soon' is not a duration/],
    ['ThrottleZone web limit=2 status=500',       qr/ThrottleZone web: .*status.*'500' is not a refusal status: 503 or 429/],
    ["ThrottleZone web limit=2\nThrottleAgent web", qr/ThrottleAgent belongs in a <VirtualHost>/],
    ["<VirtualHost 127.0.0.1:1>\nThrottleAgent nowhere\n</VirtualHost>", qr/zone 'nowhere' is used at .* but never defined/],
    ["<VirtualHost 127.0.0.1:1>\nThrottleAgent\n</VirtualHost>", qr/ThrottleAgent takes one argument/],
    ["<Location /x>\nThrottleAgent web\n</Location>", qr/ThrottleAgent not allowed in <Location> context/],
    ["<VirtualHost 127.0.0.1:1>\nThrottleDrainFile /tmp/x\n</VirtualHost>", qr/ThrottleDrainFile cannot occur within <VirtualHost>/],
);

my $inherit = $ENV{INHERIT_CONF};
plan tests => 2 * @bad + 1,
    need { 'run by t/run-apache-tests (needs INHERIT_CONF)' => ($inherit && -f $inherit) };

my $httpd = $ENV{HTTPD} || Apache::Test::vars('httpd');
my $dir = tempdir(CLEANUP => 1);

sub check_config {
    my ($snippet) = @_;
    my $file = "$dir/httpd.conf";
    open my $fh, '>', $file or die;
    open my $in, '<', $inherit or die;
    my $modules = do { local $/; <$in> };
    print $fh $modules;
    print $fh "ServerRoot $dir\nServerName 127.0.0.1\nListen 127.0.0.1:1\n",
              "ErrorLog $dir/error_log\nPidFile $dir/pid\n$snippet\n";
    close $fh;
    my $out = `'$httpd' -t -f '$file' 2>&1`;
    return ($? >> 8, $out);
}

my ($rc, $out) = check_config("ThrottleZone web limit=2 queue=0 timeout=250ms retry_after=3\n"
                              . "ThrottleHandler cgi-script web\n<Location /x>\nThrottle web\n"
                              . "ThrottleBypass \"-R '127.0.0.0/8'\"\n</Location>");
ok t_cmp("$rc $out", qr/^0 Syntax OK/, 'a valid configuration passes httpd -t');

for my $case (@bad) {
    my ($snippet, $re) = @$case;
    (my $label = $snippet) =~ s/\n/ | /g;
    ($rc, $out) = check_config($snippet);
    ok t_cmp($rc != 0, 1, "refused: $label");
    ok t_cmp($out, $re, "message for: $label");
}
