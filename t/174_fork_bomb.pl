# Copyright: dwarf project.
#
# 174_fork_bomb.pl: no tree of subgraphs can take the engine from the
# others.  A fork bomb (a for_each of 3, each branch starting a subgraph of
# its own graph) ends with its top flow failed on dwarf.max_tree_flows and
# no flow of its tree left running; a cancel of the top in the middle of a
# bomb (no cap near) leaves no flow of the tree running, even those started
# while the cancel ran; DROP EXTENSION dwarf CASCADE during a bomb and 2,000
# running flows returns, without a deadlock with the workers; a task that
# starts more subgraphs than dwarf.max_step_children fails its step; and a
# priority below 0 cannot be had through dwarf.fork, dwarf.continue or
# dwarf.subgraph by a role that may not create one.
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
my $node = new_node('fork_bomb',
	'dwarf.max_tree_flows'    => 200,
	'dwarf.max_step_children' => 5);

# The bomb: Split hands 3 items to Spawn (for_each), and each Spawn starts a
# subgraph of the same graph.  $db gets the extension, the tasks and graphs.
my $setup = q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.split(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT '{"items": [1, 2, 3]}'::jsonb $$;
CREATE FUNCTION app.spawn(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.subgraph('bomb', '{}');
	RETURN '{}';
END $$;
SELECT dwarf.define('bomb', '{"entry": "Split", "tasks": {"Split": "app.split", "Spawn": "app.spawn"},
  "transitions": [{"from": "Split", "to": "Spawn", "for_each": "items", "as": "item"}]}');
CREATE FUNCTION app.leaf(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"leaf": true}'::jsonb $$;
SELECT dwarf.define('leaf', '{"tasks": {"Leaf": "app.leaf"}}');
-- goes to itself, for flows that keep the workers busy
CREATE FUNCTION app.loop(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.goto('Loop');
	RETURN jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1);
END $$;
SELECT dwarf.define('loop', '{"entry": "Loop", "tasks": {"Loop": "app.loop"},
  "transitions": [{"from": "Loop", "to": "Loop", "goto": true}]}');
};

# The flows of the tree under $root (itself included), by parent_id.
sub tree_sql
{
	my ($root, $what) = @_;
	return "WITH RECURSIVE tree AS (SELECT id, status FROM dwarf.flow WHERE id = $root"
	  . " UNION ALL SELECT f.id, f.status FROM dwarf.flow f JOIN tree t ON f.parent_id = t.id)"
	  . " SELECT $what FROM tree";
}

# ---------------------------------------------------------------- the cap

$node->safe_psql('postgres', $setup);
wait_for_workers($node, 'the workers run');

my $root = $node->safe_psql('postgres', q{SELECT dwarf.create('bomb', '{}')});
like(
	$node->safe_psql('postgres', "SELECT status || ': ' || error FROM dwarf.await($root, '120 s')"),
	qr/^failed: .*dwarf\.max_tree_flows/,
	'the fork bomb ends with its top flow failed on dwarf.max_tree_flows');
ok( $node->poll_query_until('postgres',
		tree_sql($root, "count(*) FILTER (WHERE status IN ('running', 'interrupted'))"), '0'),
	'no flow of the bomb is left running');
my $flows = $node->safe_psql('postgres', tree_sql($root, 'count(*)'));
cmp_ok($flows, '<=', 200, "the tree never held more flows than the cap ($flows)");
cmp_ok($flows, '>', 100, "the tree grew up to the cap ($flows)");

# Other flows still run.
is($node->safe_psql('postgres', q{SELECT status FROM dwarf.run('leaf', '{}', timeout => '60 s')}),
	'completed', 'other flows run as before');

# ---------------------------------------------------------------- children per step

$node->safe_psql('postgres', q{
CREATE FUNCTION app.many(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..6 LOOP
		PERFORM dwarf.subgraph('leaf', '{}');
	END LOOP;
	RETURN '{}';
END $$;
SELECT dwarf.define('many', '{"tasks": {"Many": "app.many"}}');
});
like(
	$node->safe_psql('postgres',
		q{SELECT status || ': ' || error FROM dwarf.run('many', '{}', timeout => '60 s')}),
	qr/^failed: subgraph "leaf" would be child flow 6 of this step, past the 5 dwarf\.max_step_children allows/,
	'a task that starts more subgraphs than dwarf.max_step_children fails');

# ---------------------------------------------------------------- priorities

$node->safe_psql('postgres', q{
CREATE ROLE alice;
GRANT USAGE ON SCHEMA app, dwarf TO alice;
CREATE FUNCTION app.park(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF dwarf.interrupt('{}') IS NULL THEN
		RETURN '{}';
	END IF;
	RETURN coalesce(dwarf.subgraph('alice_leaf', '{}'), '{}');
END $$;
GRANT dwarf_priority TO alice;
SET ROLE alice;
SELECT dwarf.define('alice_leaf', '{"tasks": {"Leaf": "app.leaf"}}');
SELECT dwarf.define('alice_park', '{"tasks": {"Park": "app.park"}}');
});
my $done = $node->safe_psql('postgres',
	q{SET ROLE alice; SELECT flow_id FROM dwarf.run('alice_leaf', '{}', priority => -5, timeout => '60 s')});
my $parked = $node->safe_psql('postgres',
	q{SET ROLE alice; SELECT dwarf.create('alice_park', '{}', priority => -5)});
is($node->safe_psql('postgres', "SELECT status FROM dwarf.await($parked, '60 s')"),
	'interrupted', 'a flow of priority -5 parks');
my $parked2 = $node->safe_psql('postgres',
	q{SET ROLE alice; SELECT dwarf.create('alice_park', '{}', priority => -5)});
is($node->safe_psql('postgres', "SELECT status FROM dwarf.await($parked2, '60 s')"),
	'interrupted', 'a second one parks');

# While alice may, her flow's child inherits priority -5.
$node->safe_psql('postgres', "SET ROLE alice; SELECT dwarf.resume($parked2, '1')");
is($node->safe_psql('postgres',
		"SELECT p.status || ' ' || c.priority FROM dwarf.await($parked2, '60 s') p"
		. " JOIN dwarf.flow c ON c.parent_id = $parked2"),
	'completed -5', 'the child of a flow whose owner may have priority -5 inherits it');

$node->safe_psql('postgres', 'REVOKE dwarf_priority FROM alice');
my $step = $node->safe_psql('postgres', "SELECT min(step_id) FROM dwarf.step WHERE flow_id = $done");
my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE alice; SELECT dwarf.fork($step, '{}')");
like($err, qr/permission denied for dwarf\.fork to start a flow with priority -5/,
	'dwarf.fork refuses to copy priority -5 for a role that may not have it');
($rc, $out, $err) = $node->psql('postgres', "SET ROLE alice; SELECT dwarf.continue($done, '{}')");
like($err, qr/permission denied for dwarf\.continue to start a flow with priority -5/,
	'dwarf.continue refuses it too');
$node->safe_psql('postgres', "SET ROLE alice; SELECT dwarf.resume($parked, '1')");
like($node->safe_psql('postgres', "SELECT status || ': ' || error FROM dwarf.await($parked, '60 s')"),
	qr/^failed: permission denied for dwarf\.subgraph to start a flow with priority -5/,
	'and dwarf.subgraph refuses to start a child of priority -5 once the owner may not');
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.flow WHERE priority < 0 AND id > $parked2"),
	'1', 'no flow below 0 was started but the allowed child');

# ---------------------------------------------------------------- cancel mid-bomb

# A database where the cap is far: the bomb grows until it is cancelled.
$node->safe_psql('postgres', 'CREATE DATABASE big');
$node->safe_psql('postgres', q{ALTER DATABASE big SET dwarf.max_tree_flows = 10000000});
$node->safe_psql('big', $setup);
wait_for_workers($node, 'the workers of the second database run', db => 'big');

$root = $node->safe_psql('big', q{SELECT dwarf.create('bomb', '{}')});
ok($node->poll_query_until('big', 'SELECT count(*) >= 5000 FROM dwarf.flow'),
	'the bomb has grown to 5,000 flows');
is($node->safe_psql('big', "SELECT dwarf.cancel($root, 'enough')"), 't', 'its top is cancelled');
ok( $node->poll_query_until('big',
		tree_sql($root, "count(*) FILTER (WHERE status IN ('running', 'interrupted'))"), '0'),
	'no flow of the tree is left running');
$flows = $node->safe_psql('big', tree_sql($root, 'count(*)'));
# Every worker has taken its notes once a flow made after the cancel completes.
is($node->safe_psql('big', q{SELECT status FROM dwarf.run('leaf', '{}', timeout => '60 s')}),
	'completed', 'a new flow runs to completion after the cancel');
is($node->safe_psql('big', tree_sql($root, 'count(*)')), $flows,
	"the cancelled tree started no flow since ($flows flows)");
is( $node->safe_psql('big',
		tree_sql($root, "count(*) FILTER (WHERE status IN ('running', 'interrupted'))")),
	'0', 'and none of its flows runs');
is($node->safe_psql('big', "SELECT dwarf.cancel($root)"), 'f',
	'cancelling the closed top again returns false');

# ---------------------------------------------------------------- running steps of a tree

# A cancel of a tree too large for a note per flow (one note for the tree)
# stops the steps of the tree already running, in a worker or a runner, as
# a flow's own cancel does: the top's 100 for_each branches each start a
# child that naps in app.nap (up to ten minutes, a tenth of a second at a
# time) until the top is cancelled.
$node->safe_psql('big', q{
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1 .. 6000 LOOP
		PERFORM pg_catalog.pg_sleep(0.1);
	END LOOP;
	RETURN '{}';
END $$;
SELECT dwarf.define('nap', '{"tasks": {"Nap": "app.nap"}}');
CREATE FUNCTION app.start_nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.subgraph('nap', '{}');
	RETURN '{}';
END $$;
CREATE FUNCTION app.hundred(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('items', (SELECT jsonb_agg(i) FROM generate_series(1, 100) i)) $$;
SELECT dwarf.define('naps', '{"entry": "Split", "tasks": {"Split": "app.hundred", "Start": "app.start_nap"},
  "transitions": [{"from": "Split", "to": "Start", "for_each": "items"}]}');
});
my $napping = q{SELECT count(*) FROM pg_stat_activity
 WHERE backend_type IN ('dwarf worker', 'dwarf runner') AND wait_event = 'PgSleep'};
$root = $node->safe_psql('big', q{SELECT dwarf.create('naps', '{}')});
ok($node->poll_query_until('big', tree_sql($root, 'count(*) = 101')),
	'a tree of 101 flows: the top and its 100 napping children');
ok($node->poll_query_until('big', "SELECT ($napping) > 0"), 'steps of the tree nap');
my $log_from = -s $node->logfile;
is($node->safe_psql('big', "SELECT dwarf.cancel($root)"), 't', 'the top of the napping tree is cancelled');
ok($node->poll_query_until('big', $napping, '0'),
	'no step of the cancelled tree runs on (none would end for ten minutes)');
like(substr(slurp_file($node->logfile), $log_from), qr/the running step of task "Nap" of flow \d+ was stopped: its flow was cancelled/,
	'the log says a running step was stopped for the cancel');
is( $node->safe_psql('big',
		tree_sql($root, "count(*) FILTER (WHERE status IN ('running', 'interrupted'))")),
	'0', 'no flow of the napping tree runs');

# ---------------------------------------------------------------- a drop that is refused

# Only a role that may drop dwarf stops its workers for the drop: anyone
# else's DROP EXTENSION fails on its privileges, and the workers run on.
my $workers = q{SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity
 WHERE backend_type = 'dwarf worker' AND datname = 'big'};
my $before = $node->safe_psql('big', $workers);
$node->safe_psql('big', 'CREATE ROLE nobody_special LOGIN');
($rc, $out, $err) = $node->psql('big', 'DROP EXTENSION dwarf CASCADE',
	extra_params => [ '-U', 'nobody_special' ]);
like($err, qr/must be owner of extension dwarf/, "an ordinary role's DROP EXTENSION dwarf is refused");
is($node->safe_psql('big', $workers), $before, 'and the workers it could not drop run on, the same processes');

# ---------------------------------------------------------------- drop under load

$node->safe_psql('big', q{SELECT count(dwarf.create('loop', '{}')) FROM generate_series(1, 2000)});
$root = $node->safe_psql('big', q{SELECT dwarf.create('bomb', '{}')});
ok( $node->poll_query_until('big',
		"SELECT count(*) >= 3000 FROM dwarf.flow WHERE id > $root"),
	'a new bomb runs beside 2,000 looping flows');
my $log_at = -s $node->logfile;
($rc, $out, $err) = $node->psql('big',
	"SET statement_timeout = '120 s'; DROP EXTENSION dwarf CASCADE");
is($rc, 0, 'DROP EXTENSION dwarf CASCADE succeeds during the bomb') or diag $err;
wait_for_workers($node, 'the dropped database keeps no dwarf worker', db => 'big', count => 0);
# Neither the drop nor a worker met a deadlock (whichever the server picks
# as its victim, the other goes on).
unlike(slurp_file($node->logfile, $log_at), qr/deadlock detected/,
	'no deadlock between the drop and the workers');
is($node->safe_psql('postgres', "SELECT status FROM dwarf.run('leaf', '{}', timeout => '60 s')"),
	'completed', 'the other database runs flows as before');

check_no_crash($node, 'no backend crashed');
stop_node($node, $t0);
done_testing();
