<?php
// The PHP side of t/php_fpm.t: like cgi-bin/probe.cgi, under an exclusive
// lock it counts how many copies of itself run at once in the pool (per
// tag) and keeps the highest count, in the same "running highest" file
// format, then sleeps and answers with what the module told it. With
// flush=1 it sends its headers and a first line, and flush()es them, before
// it works, as pages that stream do.
$tag = preg_match('/^\w+$/', $_GET['tag'] ?? '') ? $_GET['tag'] : 'default';
$ms = preg_match('/^\d+$/', $_GET['sleep'] ?? '') ? (int)$_GET['sleep'] : 0;
$dir = $_SERVER['PROBE_DIR'] ?? '';
if ($dir === '') {
    http_response_code(500);
    exit("PROBE_DIR not set\n");
}

function with_count(string $file, int $delta): void
{
    $fh = fopen($file, 'c+');
    flock($fh, LOCK_EX);
    $parts = explode(' ', trim((string)stream_get_contents($fh)) ?: '0 0');
    $cur = (int)$parts[0] + $delta;
    $max = max((int)($parts[1] ?? 0), $cur);
    ftruncate($fh, 0);
    rewind($fh);
    fwrite($fh, "$cur $max\n");
    fflush($fh);
    flock($fh, LOCK_UN);
    fclose($fh);
}

$flush = ($_GET['flush'] ?? '') === '1';
with_count("$dir/$tag.count", +1);
header('Content-Type: text/plain');
if ($flush) {
    echo "started\n";
    flush();
}
usleep($ms * 1000);
with_count("$dir/$tag.count", -1);
printf("zone=%s result=%s pid=%d\n", $_SERVER['THROTTLE_ZONE'] ?? '-',
       $_SERVER['THROTTLE_RESULT'] ?? '-', getmypid());
