package BenchEnv;
# The Perl reports' side of bench/lib.sh's bench_env and its helpers: they
# run the shell functions, so that the environment paragraph and the core
# counts have one definition.
use strict;
use warnings;
use Exporter 'import';
use File::Basename qw(dirname);
use File::Spec;

our @EXPORT_OK = qw(bench_env bench_ncpus bench_version bench_cores_named);
my $lib = File::Spec->rel2abs(dirname(__FILE__) . '/lib.sh');

sub shell {
    my ($f, @args) = @_;
    open my $p, '-|', 'bash', '-c', '. "$0" && "$@"', $lib, $f, @args or die "bash: $!";
    local $/;
    my $r = <$p> // '';
    close $p or die "bench/lib.sh $f failed\n";
    return $r;
}
sub line { my $r = shell(@_); chomp $r; $r }

# bench_env([SERVER_CPUS, CLIENT_CPUS]): the paragraph under a report's title.
sub bench_env { shell('bench_env', @_) }
# The number of cores this run may use.
sub bench_ncpus { line('bench_ncpus') }
sub bench_version { line('bench_version', @_) }
sub bench_cores_named { line('bench_cores_named', @_) }

1;
