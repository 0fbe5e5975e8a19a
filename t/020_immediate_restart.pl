# Copyright: dwarf project.
#
# 020_immediate_restart.pl: stop the server with "pg_ctl stop -m immediate"
# while flows are running, start it again, and check that every flow is
# rebuilt from dwarf.flow and dwarf.step and runs to completion with each
# task's SQL write committed exactly once and the right final state.  The
# load has two parts: flows that are running at the stop, and flows that were
# created (committed) before the stop but had not started yet.  The server is
# stopped a second time while the restarted workers are catching up.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NFLOWS  = 1000;   # running at the stop
my $NQUEUED = 300;    # created before the stop, at a lower priority: not started yet

my $t0   = time;
my $node = new_node('immediate_restart');    # dwarf preloaded, 2 workers, restart_after_crash

# ---------------------------------------------------------------- setup
#
# DwarfTest's graph "g" of $NTASKS tasks:
# a1 -> a2 -> a3 -> (b1 | b2 | b3) -> j (fan-in) -> c1 -> c2 -> c3.
# Every task records itself in public.done (primary key: a second execution
# of the same task of the same flow would fail the step) and returns a
# delta: one to add to "count", its name to append to "trail".
create_graph($node, 'postgres');

# The workers are up and the graph works before we load it.
wait_for_workers($node, 'two dwarf workers run');
check_warm_up_flow($node, 'postgres');

# ---------------------------------------------------------------- load

# Priority is strict (lower first): the "queued" flows start only when the
# "create" flows no longer have runnable steps.
$node->safe_psql('postgres', "
	BEGIN;
	SELECT count(dwarf.create('g', jsonb_build_object('n', i, 'src', 'create')))
	  FROM generate_series(1, $NFLOWS) i;
	SELECT count(dwarf.create('g', jsonb_build_object('n', i, 'src', 'queued'), priority => 10))
	  FROM generate_series(1, $NQUEUED) i;
	COMMIT;");

my $steps_goal = int($NFLOWS * $NTASKS / 5);
ok( $node->poll_query_until('postgres', "SELECT count(*) >= $steps_goal FROM dwarf.step"),
	"the load is under way (at least $steps_goal steps done)");

my $stopped_at = $node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE status = 'running') || ' '
	    || count(*) FILTER (WHERE status = 'running' AND input->>'src' = 'queued'
	                          AND NOT EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id)) || ' '
	    || (SELECT count(*) FROM dwarf.step)
	  FROM dwarf.flow f});
$node->stop('immediate');
my ($running_before, $unstarted_before, $steps_before) = split / /, $stopped_at;
note "just before the stop: $running_before running ($unstarted_before of them not started), $steps_before steps";
cmp_ok($running_before, '>', 0, 'flows were running when the server stopped');
cmp_ok($unstarted_before, '>', 0, 'some committed flows had not started when the server stopped');

# ---------------------------------------------------------------- first restart

start_after_immediate_stop($node, 'the server log shows the restart recovered from an immediate stop');
wait_for_workers($node, 'two dwarf workers run after the restart');

# Let the new workers make some progress, then stop again in the middle of it.
my $steps_goal2 = $steps_before + int($NFLOWS * $NTASKS / 10);
ok( $node->poll_query_until('postgres', "SELECT count(*) >= $steps_goal2 FROM dwarf.step"),
	"the restarted workers make progress (at least $steps_goal2 steps done)");
my $running_before2 = $node->safe_psql('postgres',
	"SELECT count(*) FROM dwarf.flow WHERE status = 'running'");
$node->stop('immediate');
note "just before the second stop: $running_before2 running";
cmp_ok($running_before2, '>', 0, 'flows were running at the second stop too');

# ---------------------------------------------------------------- second restart

$node->start;
wait_flows_closed($node, 'postgres', 'every flow has closed after the restarts');

is( $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE input->>'src' = 'create') || ' '
		     || count(*) FILTER (WHERE input->>'src' = 'queued')
		   FROM dwarf.flow"),
	"$NFLOWS $NQUEUED", 'no flow was lost or added');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE input->>'src' = 'queued' AND status = 'completed'"),
	$NQUEUED, 'the flows that had not started before the stop completed');

# Every flow completed, each task's write and step row are there exactly
# once, and every final state is {count: 10, trail: [a1..c3], n: input n}.
check_flows_exactly_once($node, 'postgres', when => 'after the immediate restarts');

check_new_flow($node, 'postgres', 'a new flow runs to completion after the restart');

# Our immediate stops leave no crash lines in the log: any one of them is a
# crash of the engine (with restart_after_crash = on the server went on after it).
check_no_crash($node, 'no backend crashed');

# A wedged worker may not answer SIGTERM: stop_node stops hard when something failed.
stop_node($node, $t0);
done_testing();
