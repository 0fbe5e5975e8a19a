# Copyright: dwarf project.
#
# 150_runner_restarts.pl: a slow step runs in a runner, once, whatever
# happens to the worker that lent it or to its flow meanwhile.
#
#  1. The lending worker is terminated while its runner runs, and comes back
#     in another shared-memory slot (the workers are stopped in the order
#     that makes the launcher give their slots the other way round): the
#     new worker adopts the runner by its number in the database, not by its
#     slot, and does not lend the same step again.  The task's write happens
#     once, and the flow has one completed row for the step.
#  2. The flow is cancelled while its runner runs: the runner's step is
#     stopped and not kept (no row after the cancel, the task's write rolled
#     back).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0   = time;
my $node = new_node('runner_restarts', max_worker_processes => 32);
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE TABLE ran (flow_id bigint, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ran (flow_id) VALUES (dwarf.flow_id());
	PERFORM pg_sleep((s->>'sleep')::float8);
	RETURN '{"slept": true}';
END $$;
SELECT dwarf.define('slow', '{"tasks": {"S": "slow"}}');
});
wait_for_workers($node, 'two workers run');

is($node->safe_psql('postgres',
		q{SELECT status FROM dwarf.run('slow', '{"sleep": 0.5}', timeout => '30 s')}),
	'completed', 'the slow task ran once in a worker (it is now known to be slow)');

# A flow whose step a runner takes; returns its id once the runner runs it.
sub lent_flow
{
	my ($sleep) = @_;
	my $id = $node->safe_psql('postgres', "SELECT dwarf.create('slow', '{\"sleep\": $sleep}')");
	ok($node->poll_query_until('postgres',
			"SELECT count(*) = 1 FROM pg_stat_activity
			  WHERE backend_type = 'dwarf runner' AND wait_event = 'PgSleep'"),
		"a runner runs the step of flow $id");
	return $id;
}

# ------------------------------------------------ 1. the lender restarts
my $id = lent_flow(6);
# Worker 1 first, then worker 0: worker 1 starts again first and takes the
# lowest free slot, worker 0 the next one.
for my $n (1, 0)
{
	$node->safe_psql('postgres', qq{
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		 WHERE backend_type = 'dwarf worker' AND application_name = 'dwarf worker $n'});
	sleep(0.4);
}
wait_for_workers($node, 'both workers are back');
ok($node->poll_query_until('postgres',
		"SELECT status = 'completed' FROM dwarf.flow WHERE id = $id"),
	'the flow completes');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'dwarf runner'"),
	'no runner is left (a second one would have lent the step again)');
is($node->safe_psql('postgres', "SELECT count(*) FROM ran WHERE flow_id = $id"),
	'1', "the task's write happened once");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE flow_id = $id AND task = 'S'"),
	'1', 'the flow has one row for the step');

# ------------------------------------------------ 2. the flow is cancelled
$id = lent_flow(3);
$node->safe_psql('postgres', "SELECT dwarf.cancel($id, 'changed my mind')");
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'dwarf runner'"),
	'the runner is done (its step stopped: it would sleep 3 s)');
is($node->safe_psql('postgres', "SELECT status FROM dwarf.flow WHERE id = $id"),
	'cancelled', 'the flow stays cancelled');
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.step WHERE flow_id = $id"),
	'0', 'no step row came after the cancel');
is($node->safe_psql('postgres', "SELECT count(*) FROM ran WHERE flow_id = $id"),
	'0', "the runner's write was rolled back");

# The engine goes on.
is($node->safe_psql('postgres',
		q{SELECT status FROM dwarf.run('slow', '{"sleep": 0}', timeout => '30 s')}),
	'completed', 'a new flow completes');
check_no_crash($node);
stop_node($node, $t0);
done_testing();
