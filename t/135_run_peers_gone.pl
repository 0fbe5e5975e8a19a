# Copyright: dwarf project.
#
# 135_run_peers_gone.pl: dwarf.run's create request outlives neither of its
# two ends, and what dwarf.run says of its flow is true.
#
#  1. A caller terminated while its 5 KB input (too large for its request
#     slot, so in a DSM segment) waits for a busy worker leaves nothing
#     behind: no flow is created for it, and runs from the backends that
#     come after it (one of which gets its PGPROC, and so its slot) are
#     served at once.
#  2. A flow deleted while dwarf.run or dwarf.await waits for it is reported
#     deleted, not completed.
#  3. A worker terminated while it holds a request (taken, its create
#     blocked on a lock) gives it back: the next worker creates the flow,
#     once, and the caller gets its outcome.
#
# One worker, so that it owns every flow, and dwarf.long_step = 0, so that a
# step that blocks holds the worker (no runner takes it over).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0   = time;
my $MAX_CONNECTIONS = 10;
my $node = new_node('run_peers_gone', 'dwarf.workers' => 1, 'dwarf.long_step' => 0,
	max_connections => $MAX_CONNECTIONS);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.echo(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"ok": true}'::jsonb $$;
-- waits while the test holds advisory lock 42
CREATE FUNCTION app.gate(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.pg_advisory_xact_lock_shared(42);
	RETURN '{"gated": true}';
END $$;
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep('1 hour');
	RETURN '{"napped": true}';
END $$;
SELECT dwarf.define('echo', '{"tasks": {"A": "app.echo"}}');
SELECT dwarf.define('gate', '{"tasks": {"A": "app.gate"}}');
SELECT dwarf.define('nap', '{"tasks": {"A": "app.nap", "B": "app.echo"},
  "transitions": [{"from": "A", "to": "B"}]}');
});
wait_for_workers($node, 'the dwarf worker runs', count => 1);

# run_in_new_backend($input, $timeout): dwarf.run of "echo" in a new
# connection, bounded by statement_timeout as well; its status, or the error.
sub run_in_new_backend
{
	my ($input, $timeout) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET statement_timeout = '30 s';
		 SELECT status FROM dwarf.run('echo', '$input', timeout => '$timeout')");
	return $rc == 0 ? $out : $err;
}

# start_client($name, $sql): psql running $sql in the background, with
# application_name $name; returns its harness and output file.
my $tmp = PostgreSQL::Test::Utils::tempdir;
sub start_client
{
	my ($name, $sql) = @_;
	my $h = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres') . " application_name=$name",
		  '-c', "SET statement_timeout = '120 s'", '-c', $sql ],
		'>', "$tmp/$name.out", '2>', "$tmp/$name.err",
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return $h;
}

my $holder = $node->background_psql('postgres');

# ---------------------------------------------------------------- 1. caller terminated

# The worker is held in a step, so the caller's request stays submitted.
$holder->query_safe('SELECT pg_advisory_lock(42)');
$node->safe_psql('postgres', q{SELECT dwarf.create('gate', '{}')});
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.backend_type = 'dwarf worker' AND l.locktype = 'advisory' AND NOT l.granted}, '1'),
	'the worker is held in a step');

my $victim = start_client('victim',
	q{SELECT status FROM dwarf.run('echo', jsonb_build_object('pad', repeat('x', 5000)), timeout => '60 s')});
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		 WHERE application_name = 'victim' AND wait_event_type = 'Extension'}, '1'),
	'a dwarf.run with a 5 KB input waits for the worker');
my $victim_pid = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE application_name = 'victim'});
$node->safe_psql('postgres', "SELECT pg_terminate_backend($victim_pid)");
eval { $victim->finish; 1 } or $victim->kill_kill;
my $polls = 0;
$polls++ while kill(0, $victim_pid) && $polls < 10 * $PostgreSQL::Test::Utils::timeout_default
  && Time::HiRes::sleep(0.1);
ok(!kill(0, $victim_pid), 'the caller is terminated and gone');

$holder->query_safe('SELECT pg_advisory_unlock(42)');
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name = 'gate' AND f.status = 'completed'}, '1'),
	'the worker goes on once the step is let go');

# As many sessions as there are PGPROCs for them besides the holder's, all
# connected at once: one of them has the terminated caller's PGPROC, and so
# its request slot.  Each one's run must be served, not wait for that slot
# to come free.
my @sessions = map { $node->background_psql('postgres', on_error_stop => 0) }
  (1 .. $MAX_CONNECTIONS - 1);
for my $i (0 .. $#sessions)
{
	my ($out) = $sessions[$i]->query(
		"SET statement_timeout = '20 s';
		 SELECT status FROM dwarf.run('echo', '{\"n\": $i}', timeout => '15 s')");
	is($out, 'completed', "session $i: its run completes after the terminated caller")
	  or diag $sessions[$i]->{stderr};
}
$_->quit for @sessions;
is( $node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.flow WHERE input ? 'pad'}),
	'0', 'no flow was created for the terminated caller');

# ---------------------------------------------------------------- 2. deleted while waited for

my $waiter = $node->background_psql('postgres', on_error_stop => 0);
$waiter->query_until(qr/started/,
	qq{\\echo started\nSELECT status FROM dwarf.run('nap', '{"d": "run"}', timeout => '60 s');\n});
my $nap_step = q{
	SELECT count(*) FROM dwarf.flow f JOIN dwarf.step s ON s.flow_id = f.id
	 WHERE f.input->>'d' = '%s' AND s.task = 'A'};
ok($node->poll_query_until('postgres', sprintf($nap_step, 'run'), '1'),
	'a dwarf.run waits for a flow that sleeps');
my $run_flow = $node->safe_psql('postgres', q{SELECT id FROM dwarf.flow WHERE input->>'d' = 'run'});
$node->safe_psql('postgres', "SELECT dwarf.delete($run_flow)");
my ($out) = $waiter->query('');
is($out, '', 'dwarf.run returns no outcome for the deleted flow');
like($waiter->{stderr}, qr/ERROR:  flow $run_flow was deleted while dwarf\.run waited for it/,
	'dwarf.run says that the flow it waited for was deleted');
$waiter->{stderr} = '';

my $await_flow = $node->safe_psql('postgres', q{SELECT dwarf.create('nap', '{"d": "await"}')});
ok($node->poll_query_until('postgres', sprintf($nap_step, 'await'), '1'),
	'a created flow sleeps');
$waiter->query_until(qr/started/,
	qq{\\echo started\nSELECT status FROM dwarf.await($await_flow, '60 s');\n});
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		 WHERE query LIKE 'SELECT status FROM dwarf.await(%' AND wait_event_type = 'Extension'}, '1'),
	'dwarf.await waits for it');
$node->safe_psql('postgres', "SELECT dwarf.delete($await_flow)");
($out) = $waiter->query('');
is($out, '', 'dwarf.await returns no outcome for the deleted flow');
like($waiter->{stderr}, qr/ERROR:  flow $await_flow was deleted while dwarf\.await waited for it/,
	'dwarf.await says that the flow it waited for was deleted');
$waiter->quit;

# ---------------------------------------------------------------- 3. worker terminated

# The worker takes the request and blocks on the lock its create needs.
$holder->query_safe('BEGIN; LOCK TABLE dwarf.flow IN SHARE MODE');
my $caller = start_client('taken',
	q{SELECT status FROM dwarf.run('echo', '{"k": "taken"}', timeout => '90 s')});
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.backend_type = 'dwarf worker' AND l.locktype = 'relation' AND NOT l.granted}, '1'),
	"the worker has taken the request and waits for the lock its create needs");
my $worker = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'});
$node->safe_psql('postgres', "SELECT pg_terminate_backend($worker)");
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE pid = $worker", '0'),
	'the worker is terminated');
$holder->query_safe('COMMIT');

eval { $caller->finish; 1 } or $caller->kill_kill;
is(slurp_file("$tmp/taken.out"), "completed\n",
	'the caller gets its outcome from the next worker')
  or diag slurp_file("$tmp/taken.err");
is( $node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.flow WHERE input->>'k' = 'taken'}),
	'1', 'its flow was created once');
isnt($node->safe_psql('postgres',
		q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'}),
	$worker, 'a new worker runs');
for my $i (1 .. 3)
{
	is(run_in_new_backend("{\"m\": $i}", '20 s'), 'completed',
		"run $i from a new backend completes after the worker was replaced");
}

$holder->quit;
check_no_crash($node, 'no backend crashed');
stop_node($node, $t0);
done_testing();
