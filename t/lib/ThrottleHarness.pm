package ThrottleHarness;
# The harness t/run-apache-tests runs the suite with (HARNESS_SUBCLASS): the
# same as TAP::Harness, and it writes every skip, a file skipped whole or
# one check skipped, to AT_SKIP_LOG as "t/NAME.t<TAB>plan|test<TAB>reason"
# lines (plan: the file skipped whole), so that
# a skip can be counted apart from a pass and checked against
# t/skips-allowed. (Non-verbose TAP output shows neither.) With AT_TIME_LOG
# it also writes each file's wall time there ("t/NAME.t<TAB>seconds"), which
# t/run-apache-tests shows and t/durations keeps for splitting the suite.
use strict;
use warnings;
use parent 'TAP::Harness';
use Time::HiRes qw(time);

sub new {
    my ($class, @args) = @_;
    my $self = $class->SUPER::new(@args);
    my $log = $ENV{AT_SKIP_LOG};
    my $times = $ENV{AT_TIME_LOG};
    return $self unless $log || $times;
    $self->callback(made_parser => sub {
        my ($parser, $job) = @_;
        my $file = $job->[0];
        my $began = time;
        $parser->callback(EOF => sub {
            open my $fh, '>>', $times or die "$times: $!";
            printf $fh "%s\t%.1f\n", $file, time - $began;
            close $fh;
        }) if $times;
        return unless $log;
        my $record = sub {
            my ($kind, $why) = @_;
            open my $fh, '>>', $log or die "$log: $!";
            $why = '(no reason given)' unless defined $why && length $why;
            $why =~ s/\s+/ /g;
            print $fh "$file\t$kind\t$why\n";
            close $fh;
        };
        $parser->callback(plan => sub {
            my ($plan) = @_;
            $record->('plan', $plan->explanation) if $plan->directive eq 'SKIP';
        });
        $parser->callback(test => sub {
            my ($test) = @_;
            $record->('test', $test->explanation) if $test->has_skip;
        });
    });
    return $self;
}

1;
