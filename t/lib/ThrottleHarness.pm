package ThrottleHarness;
# The harness t/run-apache-tests runs the suite with (HARNESS_SUBCLASS): the
# same as TAP::Harness, and it writes every skip, a file skipped whole or
# one check skipped, to AT_SKIP_LOG as "t/NAME.t<TAB>plan|test<TAB>reason"
# lines (plan: the file skipped whole), so that
# a skip can be counted apart from a pass and checked against
# t/skips-allowed. (Non-verbose TAP output shows neither.)
use strict;
use warnings;
use parent 'TAP::Harness';

sub new {
    my ($class, @args) = @_;
    my $self = $class->SUPER::new(@args);
    my $log = $ENV{AT_SKIP_LOG} or return $self;
    $self->callback(made_parser => sub {
        my ($parser, $job) = @_;
        my $file = $job->[0];
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
