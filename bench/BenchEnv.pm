package BenchEnv;
# The Perl side of bench/lib.sh's bench_env_record and bench_env: they run
# the shell functions, so that the environment a run records and the
# paragraph its report starts with have one definition. A report reads the
# environment its run recorded (run_env, bench_env DIR), never the tree or
# the machine it is written on.
use strict;
use warnings;
use Exporter 'import';
use File::Basename qw(dirname);
use File::Spec;

our @EXPORT_OK = qw(bench_env bench_envs bench_env_record run_env cores_named cores_count);
my $lib = File::Spec->rel2abs(dirname(__FILE__) . '/lib.sh');

sub shell {
    my ($f, @args) = @_;
    open my $p, '-|', 'bash', '-c', '. "$0" && "$@"', $lib, $f, @args or die "bash: $!";
    local $/;
    my $r = <$p> // '';
    close $p or die "bench/lib.sh $f @args failed\n";
    return $r;
}

# bench_env_record(DIR[, SERVER_CPUS, CLIENT_CPUS]): as a run starts.
sub bench_env_record { shell('bench_env_record', @_); return }
# bench_env(DIR): the paragraph under a report's title.
sub bench_env { shell('bench_env', @_) }
# bench_envs(LABEL => DIR, ...): the same for a report of several runs.
sub bench_envs {
    my @pairs = @_;
    my @args;
    push @args, shift(@pairs) . '=' . shift(@pairs) while @pairs;
    return shell('bench_envs', @args);
}

# run_env(DIR): the environment the run in DIR recorded, as a hash.
sub run_env {
    my ($dir) = @_;
    open my $fh, '<', "$dir/env"
        or die "bench: $dir/env is missing: that run did not record its environment; run it again\n";
    my %e = map { chomp; split /=/, $_, 2 } grep { /=/ } <$fh>;
    return \%e;
}

# "core 1", "cores 0-1": a taskset list in words.
sub cores_named { my ($l) = @_; $l =~ /[,-]/ ? "cores $l" : "core $l" }
# "1 core", "4 cores".
sub cores_count { my ($n) = @_; $n == 1 ? '1 core' : "$n cores" }

1;
