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

my $NFLOWS  = 1000;   # running at the stop
my $NQUEUED = 300;    # created before the stop, at a lower priority: not started yet
my @TRAIL  = qw(a1 a2 a3 b1 b2 b3 j c1 c2 c3);
my $NTASKS = scalar @TRAIL;
my $TRAIL_JSON = '[' . join(',', map { "\"$_\"" } @TRAIL) . ']';

my $t0   = time;
my $node = PostgreSQL::Test::Cluster->new('immediate_restart');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'dwarf'
dwarf.workers = 2
max_worker_processes = 16
restart_after_crash = on
});
$node->start;

# ---------------------------------------------------------------- setup
#
# Ten tasks: a1 -> a2 -> a3 -> (b1 | b2 | b3) -> j (fan-in) -> c1 -> c2 -> c3.
# Every task records itself in done (primary key: a second execution of the
# same task of the same flow would fail the step) and returns a delta: one
# to add to "count", its name to append to "trail".
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE TABLE public.done (flow_id bigint, task text, at timestamptz DEFAULT clock_timestamp(),
                          PRIMARY KEY (flow_id, task));
CREATE SCHEMA app;
CREATE FUNCTION app.work(s jsonb, task text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.pg_sleep(0.001);
	INSERT INTO public.done (flow_id, task) VALUES (dwarf.flow_id(), task);
	RETURN pg_catalog.jsonb_build_object('count', 1, 'trail', task);
END $$;
DO $$
DECLARE t text;
BEGIN
	FOREACH t IN ARRAY ARRAY['a1','a2','a3','b1','b2','b3','j','c1','c2','c3'] LOOP
		EXECUTE format('CREATE FUNCTION app.%I(s jsonb) RETURNS jsonb LANGUAGE sql '
		               'AS $f$ SELECT app.work(s, %L) $f$', t, t);
	END LOOP;
END $$;
SELECT dwarf.define('g', '{
  "tasks": {"a1": "app.a1", "a2": "app.a2", "a3": "app.a3",
            "b1": "app.b1", "b2": "app.b2", "b3": "app.b3", "j": "app.j",
            "c1": "app.c1", "c2": "app.c2", "c3": "app.c3"},
  "transitions": [
    {"chain": ["a1", "a2", "a3"]},
    {"from": "a3", "to": ["b1", "b2", "b3"]},
    {"from": "b1", "to": "j"}, {"from": "b2", "to": "j"}, {"from": "b3", "to": "j"},
    {"chain": ["j", "c1", "c2", "c3", "END"]}],
  "fan_in": ["j"],
  "reducers": {"count": "add", "trail": "append"}}');
});

# The workers are up and the graph works before we load it.
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker'", '2'),
	'two dwarf workers run');
is( $node->safe_psql('postgres',
		"SET statement_timeout = '90 s';
		 SELECT status || ' ' || (state->>'count') || ' ' || (state->'trail' = '$TRAIL_JSON'::jsonb)
		   FROM dwarf.run('g', '{\"n\": 0, \"src\": \"warmup\"}', timeout => '60 s')"),
	'completed 10 true',
	'a warm-up flow completes with the expected state');

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

my $log_offset = -s $node->logfile;
$node->start;
like( slurp_file($node->logfile, $log_offset),
	qr/database system was (interrupted|not properly shut down)/,
	'the server log shows the restart recovered from an immediate stop');
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker'", '2'),
	'two dwarf workers run after the restart');

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
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE status = 'running'", '0'),
	'every flow has closed after the restarts')
  or diag $node->safe_psql('postgres',
	"SELECT running, completed, failed, steps_done, workers FROM dwarf.stats;
	 SELECT pid, state, wait_event_type, wait_event, query, now() - query_start
	   FROM pg_stat_activity WHERE backend_type = 'dwarf worker'");

is( $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE input->>'src' = 'create') || ' '
		     || count(*) FILTER (WHERE input->>'src' = 'queued')
		   FROM dwarf.flow"),
	"$NFLOWS $NQUEUED", 'no flow was lost or added');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE input->>'src' = 'queued' AND status = 'completed'"),
	$NQUEUED, 'the flows that had not started before the stop completed');

check_outcome($node, 'after the immediate restarts');

# statement_timeout bounds the wait even if dwarf.run ignored its own timeout.
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET statement_timeout = '90 s';
	  SELECT status || ' ' || (state->>'count') FROM dwarf.run('g', '{"n": -1}', timeout => '60 s')});
is($out, 'completed 10', 'a new flow runs to completion after the restart') or diag $err;

# Our immediate stops leave no such lines: any one of them is a crash of
# the engine (with restart_after_crash = on the server went on after it).
unlike(slurp_file($node->logfile),
	qr/terminated by signal|terminated by exception|PANIC|TRAP:|all server processes terminated/,
	'no backend crashed');

note sprintf('020_immediate_restart took %.1f s', time - $t0);
# A wedged worker may not answer SIGTERM: stop hard when something failed.
$node->stop(Test::More->builder->is_passing ? 'fast' : 'immediate');
done_testing();

# ---------------------------------------------------------------- checks

# Everything we can say about a finished load, for every flow in the table.
sub check_outcome
{
	my ($node, $when) = @_;
	my $total = $node->safe_psql('postgres', 'SELECT count(*) FROM dwarf.flow');
	note "$total flows in dwarf.flow $when";

	is( $node->safe_psql('postgres',
			"SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
			   FROM (SELECT status, count(*) n FROM dwarf.flow GROUP BY status) s"),
		"completed=$total", "all $total flows completed $when");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.flow WHERE error IS NOT NULL"),
		'0', "no flow has an error $when")
	  or diag $node->safe_psql('postgres',
		"SELECT id, status, error FROM dwarf.flow WHERE error IS NOT NULL LIMIT 10");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step WHERE status = 'failed' OR error IS NOT NULL"),
		'0', "no step failed (no duplicate-key error from a re-run task) $when")
	  or diag $node->safe_psql('postgres',
		"SELECT flow_id, task, attempt, error->>'message' FROM dwarf.step
		  WHERE status = 'failed' OR error IS NOT NULL LIMIT 10");

	# Each task's SQL write happened once per flow.
	is($node->safe_psql('postgres', 'SELECT count(*) FROM public.done'),
		$NTASKS * $total, "done has $NTASKS rows per flow in total $when");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.flow f
			  WHERE (SELECT count(*) FROM public.done d WHERE d.flow_id = f.id) <> $NTASKS"),
		'0', "every flow has exactly $NTASKS done rows $when");
	is( $node->safe_psql('postgres',
			'SELECT count(*) FROM public.done d WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.id = d.flow_id)'),
		'0', "no done row belongs to an unknown flow $when");

	# The step log: one completed row per (flow, task), nothing else.
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM (SELECT flow_id, task FROM dwarf.step
			                        GROUP BY flow_id, task HAVING count(*) <> 1) x"),
		'0', "dwarf.step has exactly one row per (flow, task) $when")
	  or diag $node->safe_psql('postgres',
		"SELECT flow_id, task, count(*) FROM dwarf.step GROUP BY 1, 2 HAVING count(*) <> 1 LIMIT 10");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step WHERE status = 'completed'"),
		$NTASKS * $total, "dwarf.step has $NTASKS completed steps per flow $when");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step s FULL JOIN public.done d
			     ON d.flow_id = s.flow_id AND d.task = s.task
			  WHERE s.flow_id IS NULL OR d.flow_id IS NULL"),
		'0', "every step row has its task's write and every write its step row $when");

	# The final state: the counter added up, the trail in graph order, the input kept.
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.flow
			  WHERE state IS NULL
			     OR state->'count' IS DISTINCT FROM '10'::jsonb
			     OR state->'trail' IS DISTINCT FROM '$TRAIL_JSON'::jsonb
			     OR state->'n' IS DISTINCT FROM input->'n'"),
		'0', "every flow's final state is {count: 10, trail: [a1..c3], n: input n} $when")
	  or diag $node->safe_psql('postgres',
		"SELECT id, input, state FROM dwarf.flow
		  WHERE state IS NULL OR state->'count' IS DISTINCT FROM '10'::jsonb
		     OR state->'trail' IS DISTINCT FROM '$TRAIL_JSON'::jsonb LIMIT 5");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.flow WHERE finished_at IS NULL"),
		'0', "every flow has finished_at $when");
}
