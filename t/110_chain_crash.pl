# Copyright: dwarf project.
#
# 110_chain_crash.pl: kill -9 a dwarf worker between two chained steps.
#
# With chaining, a step's successor runs in the step's own transaction, so
# a crash after A returned but before the batch committed takes A back with
# its successor.  Graph "cc" is A -> B -> C; B waits for an advisory lock
# that a session of the test holds, so every worker's batch stops in the
# first B it reaches, with the A steps of its flows (and that B's A) done
# but not committed.  We check from outside that the B a worker is running
# is chained (its flow has no committed step or write), kill that worker,
# and after the postmaster's crash restart (which also ends the session
# holding the lock) check that every flow completed, each task's write
# committed exactly once, in the transaction of its step row, one step row
# per task, and the final state is right.
#
# Determinism: the kill happens while B is waiting for the lock, a
# condition polled for, never a timed sleep.  dwarf.long_step = 0 keeps the
# long wait in B from making the task "slow" (its steps would then run in
# runners, one commit each, never chained).  dwarf.batch_time = 60 s keeps a
# slow machine's clock from ending a batch between an A and its B (B would
# then run in a later batch, unchained).  The step in flight is blamed once
# (crashes.c), below dwarf.step_crashes, so it runs again, in a runner, and
# completes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NFLOWS = 50;      # flows in flight at the crash
my $GATE   = 4242;    # the advisory lock B waits for
my $TRAIL  = '["A", "B", "C"]';

my $t0   = time;
my $node = new_node('chain_crash', 'dwarf.long_step' => 0, 'dwarf.batch_time' => "'60s'");

# ---------------------------------------------------------------- setup
#
# Every task records itself in public.done (primary key: a second
# execution of a task of a flow would fail the step), with the transaction
# that wrote it, and returns {count: 1, trail: its name}.  B shows the flow
# it runs for in its application_name (rolled back when it returns) and
# then waits for the gate, shared: free, it waits for nothing.
$node->safe_psql('postgres', qq{
CREATE EXTENSION dwarf;
CREATE TABLE public.done (flow_id bigint, task text, txn xid8 DEFAULT pg_current_xact_id(),
                          PRIMARY KEY (flow_id, task));
CREATE SCHEMA app;
CREATE FUNCTION app.work(task text) RETURNS jsonb LANGUAGE sql AS \$\$
	INSERT INTO public.done (flow_id, task) VALUES (dwarf.flow_id(), task);
	SELECT pg_catalog.jsonb_build_object('count', 1, 'trail', task);
\$\$;
CREATE FUNCTION app.a(s jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT app.work('A') \$\$;
CREATE FUNCTION app.b(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM pg_catalog.set_config('application_name', 'in B of ' || dwarf.flow_id(), false);
	PERFORM pg_catalog.pg_advisory_xact_lock_shared($GATE);
	RETURN app.work('B');
END \$\$;
CREATE FUNCTION app.c(s jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT app.work('C') \$\$;
SELECT dwarf.define('cc', '{"tasks": {"A": "app.a", "B": "app.b", "C": "app.c"},
  "transitions": [{"chain": ["A", "B", "C", "END"]}],
  "reducers": {"count": "add", "trail": "append"}}');
});

wait_for_workers($node, 'two dwarf workers run');
is( $node->safe_psql('postgres',
		"SET statement_timeout = '90 s';
		 SELECT status || ' ' || (state->>'count') || ' ' || (state->'trail' = '$TRAIL'::jsonb)
		   FROM dwarf.run('cc', '{\"n\": 0}', timeout => '60 s')"),
	'completed 3 true', 'a warm-up flow completes with the gate open');

# ---------------------------------------------------------------- the gate

my $tmp = PostgreSQL::Test::Utils::tempdir;
append_to_file("$tmp/gate.sql",
	"SELECT pg_advisory_lock($GATE);\nSELECT pg_sleep(600);\n");
my $gate_h = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-f', "$tmp/gate.sql" ],
	'>', "$tmp/gate.out", '2>', "$tmp/gate.err",
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_locks
		  WHERE locktype = 'advisory' AND objid = $GATE AND mode = 'ExclusiveLock' AND granted"),
	'a session holds the gate');

# ---------------------------------------------------------------- load

$node->safe_psql('postgres',
	"SELECT count(dwarf.create('cc', jsonb_build_object('n', i)))
	   FROM generate_series(1, $NFLOWS) i");

# A worker waits in B for the gate.
ok( $node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity
		  WHERE backend_type = 'dwarf worker' AND wait_event = 'advisory'
		    AND application_name LIKE 'in B of %'"),
	'a dwarf worker is running B, waiting for the gate');
my ($victim, $vflow) = split / /, $node->safe_psql('postgres',
	"SELECT pid || ' ' || substr(application_name, 9) FROM pg_stat_activity
	  WHERE backend_type = 'dwarf worker' AND wait_event = 'advisory'
	    AND application_name LIKE 'in B of %'
	  ORDER BY pid LIMIT 1");
ok($victim =~ /^\d+$/ && $vflow =~ /^\d+$/, "worker $victim runs B of flow $vflow");

# B runs, so A of its flow has returned; nothing of that flow has
# committed: A ran in the transaction now running B (they are chained).
is( $node->safe_psql('postgres',
		"SELECT (SELECT count(*) FROM dwarf.step WHERE flow_id = $vflow) || ' '
		     || (SELECT count(*) FROM public.done WHERE flow_id = $vflow) || ' '
		     || (SELECT status FROM dwarf.flow WHERE id = $vflow)"),
	'0 0 running', "flow $vflow: A returned, and neither its step row nor its write has committed");

my ($running, $untouched) = split /\|/, $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE status = 'running'),
	        count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id))
	   FROM dwarf.flow f WHERE input->>'n' <> '0'");
is($running, $NFLOWS, "all $NFLOWS flows are in flight at the kill");
note "flows with no committed step at the kill: $untouched of $NFLOWS";

# ---------------------------------------------------------------- the crash

my $log_offset = -s $node->logfile;
is(kill('KILL', $victim), 1, 'sent SIGKILL to the worker running B');
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
like(slurp_file($node->logfile, $log_offset), qr/\(PID $victim\) was terminated by signal 9/,
	'the server log shows the worker was killed by signal 9');

# The crash restart ended the session holding the gate.
eval { $gate_h->finish; 1 } or $gate_h->kill_kill;
like(slurp_file("$tmp/gate.err"),
	qr/server closed the connection|terminating connection|connection to server was lost/,
	'the session holding the gate was disconnected by the crash');

# ---------------------------------------------------------------- recovery

wait_for_workers($node, 'two dwarf workers run again after the restart');
$node->wait_for_log(qr/a step of flow $vflow ended the process running it \(1 time\)/,
	$log_offset);
pass("the restarted worker blamed B of flow $vflow once");
wait_flows_closed($node, 'postgres', 'every flow has closed after the restart');

my $total = $NFLOWS + 1;
is( $node->safe_psql('postgres',
		"SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
		   FROM (SELECT status, count(*) n FROM dwarf.flow GROUP BY status) s"),
	"completed=$total", "all $total flows completed");
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE error IS NOT NULL")
	  . ' ' . $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE status <> 'completed' OR error IS NOT NULL"),
	'0 0', 'no flow has an error and no step failed (no duplicate write)')
  or diag $node->safe_psql('postgres',
	"SELECT flow_id, task, status, error->>'message' FROM dwarf.step
	  WHERE status <> 'completed' OR error IS NOT NULL LIMIT 10");

# Each task's write committed once, with its step row.
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.flow f
		  WHERE (SELECT count(*) FROM public.done d WHERE d.flow_id = f.id) <> 3
		     OR (SELECT count(*) FROM dwarf.step s WHERE s.flow_id = f.id) <> 3"),
	'0', 'every flow has exactly 3 writes and 3 step rows');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM (SELECT l.flow_id, u.task, l.xmin FROM dwarf.step_log l,
		                              unnest(l.task) u(task)) s
		   FULL JOIN public.done d ON d.flow_id = s.flow_id AND d.task = s.task
		  WHERE s.flow_id IS NULL OR d.flow_id IS NULL
		     OR s.xmin::text::bigint <> d.txn::text::bigint % 4294967296"),
	'0', "every write committed in its step row's transaction, and every step row has its write");
is( $node->safe_psql('postgres',
		"SELECT count(*) || ' ' || count(*) FILTER (WHERE task = 'A')
		   FROM dwarf.step WHERE flow_id = $vflow"),
	'3 1', "flow $vflow: A's step row is there once, as are B's and C's");

# The final state: the counter added up, the trail in order, the input kept.
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.flow
		  WHERE state IS NULL OR state->'count' IS DISTINCT FROM '3'::jsonb
		     OR state->'trail' IS DISTINCT FROM '$TRAIL'::jsonb
		     OR state->'n' IS DISTINCT FROM input->'n'"),
	'0', "every flow's final state is {count: 3, trail: [A, B, C], n: input n}")
  or diag $node->safe_psql('postgres',
	"SELECT id, input, state FROM dwarf.flow
	  WHERE state->'trail' IS DISTINCT FROM '$TRAIL'::jsonb LIMIT 5");

# The engine still works, and chains, after the crash.
is( $node->safe_psql('postgres',
		"SET statement_timeout = '90 s';
		 SELECT status || ' ' || (state->'trail' = '$TRAIL'::jsonb)
		   FROM dwarf.run('cc', '{\"n\": -1}', timeout => '60 s')"),
	'completed true', 'a new flow runs to completion after the restart');

# The only crash is the one we caused, and only its step was blamed.
my $log = slurp_file($node->logfile);
my $crashes = () = $log =~ /terminated by signal|terminated by exception/g;
is($crashes, 1, 'no backend crashed besides the worker we killed');
my @blamed = $log =~ /a step of flow (\d+) ended the process running it/g;
is("@blamed", $vflow, "only B of flow $vflow was blamed for a crash, once");
unlike($log, qr/PANIC|TRAP:/, 'no PANIC or assertion failure in the server log');

stop_node($node, $t0);
done_testing();
