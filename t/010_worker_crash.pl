# Copyright: dwarf project.
#
# 010_worker_crash.pl: kill -9 a dwarf worker while flows are running.
#
# The postmaster treats a background worker that dies by a signal as a crash:
# it terminates every backend, resets shared memory and restarts (with
# restart_after_crash = on).  dwarf's launcher then starts fresh workers that
# must rebuild every running flow from dwarf.flow and dwarf.step.  We check
# that every flow completes, that every task ran exactly once as far as the
# database can see (its SQL writes committed once, one completed step row per
# task), and that the final state is right.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep time);

my $NFLOWS = 1000;    # flows created in one transaction
my $NRUNS  = 400;     # dwarf.run calls from a background session, at most
my @TRAIL  = qw(a1 a2 a3 b1 b2 b3 j c1 c2 c3);
my $NTASKS = scalar @TRAIL;
my $TRAIL_JSON = '[' . join(',', map { "\"$_\"" } @TRAIL) . ']';

my $t0   = time;
my $node = PostgreSQL::Test::Cluster->new('worker_crash');
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

$node->safe_psql('postgres',
	"SELECT count(dwarf.create('g', jsonb_build_object('n', i, 'src', 'create')))
	   FROM generate_series(1, $NFLOWS) i");

# A client calling dwarf.run over and over, with a higher priority than the
# queued flows so that its flows run during the load.  It loses its
# connection in the crash; psql then exits.
my $script = '';
$script .= "SELECT 'run ' || status FROM dwarf.run('g', '{\"n\": $_, \"src\": \"run\"}', "
  . "timeout => '60 s', priority => -1);\n"
  for (1 .. $NRUNS);
my $tmp = PostgreSQL::Test::Utils::tempdir;
append_to_file("$tmp/run.sql", $script);
my $run_h = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-f', "$tmp/run.sql" ],
	'>', "$tmp/run.out", '2>', "$tmp/run.err",
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));

# Wait until the engine is well into the load (a tenth of its steps) and a
# few dwarf.run calls have come back (or half the load is done, if they are
# slow), then kill a worker in the middle of it.
my $steps_goal = int($NFLOWS * $NTASKS / 10);
my $steps_half = int($NFLOWS * $NTASKS / 2);
ok( $node->poll_query_until('postgres',
		"SELECT count(*) >= $steps_goal
		        AND ((SELECT count(*) FROM dwarf.flow
		               WHERE input->>'src' = 'run' AND status = 'completed') >= 3
		             OR count(*) >= $steps_half)
		   FROM dwarf.step"),
	"the load is under way (at least $steps_goal steps done)");

my $victim = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker' ORDER BY pid LIMIT 1");
my ($running_before, $completed_before, $steps_before) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE status = 'running'),
	        count(*) FILTER (WHERE status = 'completed'),
	        (SELECT count(*) FROM dwarf.step)
	   FROM dwarf.flow");
my $log_offset = -s $node->logfile;
ok($victim =~ /^\d+$/, "found a dwarf worker to kill (pid $victim)");
is(kill('KILL', $victim), 1, 'sent SIGKILL to the dwarf worker');
note "at the kill: $running_before running, $completed_before completed, $steps_before steps";
cmp_ok($running_before, '>', 0, 'flows were still running when the worker was killed');

# The postmaster notices and restarts everything.
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/\(PID $victim\) was terminated by signal 9/,
	'the server log shows the worker was killed by signal 9');

# The run client lost its connection; let it end.
eval { $run_h->finish; 1 } or $run_h->kill_kill;
my $run_out = slurp_file("$tmp/run.out");
my $run_err = slurp_file("$tmp/run.err");
my $runs_completed = () = $run_out =~ /^run completed$/mg;
my $runs_other = () = $run_out =~ /^run (?!completed$)/mg;
note "dwarf.run calls that returned completed before the crash: $runs_completed";
is($runs_other, 0, 'every dwarf.run that returned before the crash returned completed')
  or diag $run_out;
like($run_err, qr/server closed the connection|terminating connection|connection to server was lost/,
	'the dwarf.run client was disconnected by the crash');

# ---------------------------------------------------------------- recovery

ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker'", '2'),
	'two dwarf workers run again after the restart');
ok( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND pid = $victim") eq '0',
	'the killed worker is not among them');
is( $node->safe_psql('postgres',
		"SELECT count(*) >= $runs_completed FROM dwarf.flow WHERE input->>'src' = 'run'"),
	't', 'the flows of the dwarf.run calls that returned are in dwarf.flow');

ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE status = 'running'", '0'),
	'every flow has closed after the restart')
  or diag $node->safe_psql('postgres',
	"SELECT running, completed, failed, steps_done, workers FROM dwarf.stats;
	 SELECT pid, state, wait_event_type, wait_event, query, now() - query_start
	   FROM pg_stat_activity WHERE backend_type = 'dwarf worker'");

check_outcome($node, 'after the worker crash');

# The engine still works after the crash.
# statement_timeout bounds the wait even if dwarf.run ignored its own timeout.
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET statement_timeout = '90 s';
	  SELECT status || ' ' || (state->>'count') FROM dwarf.run('g', '{"n": -1}', timeout => '60 s')});
is($out, 'completed 10', 'a new flow runs to completion after the restart') or diag $err;

# The only crash is the one we caused.
$log = slurp_file($node->logfile);
my $crashes = () = $log =~ /terminated by signal|terminated by exception/g;
is($crashes, 1, 'no backend crashed besides the worker we killed');
unlike($log, qr/PANIC|TRAP:/, 'no PANIC or assertion failure in the server log');

note sprintf('010_worker_crash took %.1f s', time - $t0);
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
