# Copyright: dwarf project.
#
# 172_steps_cap_restart.pl: dwarf.max_flow_steps counts a flow's steps from
# its rows, so the count survives a restart.  A flow that goes to itself
# parks (dwarf.interrupt) after 15 steps; the server restarts; resumed, it
# fails at exactly the cap (its rows: the cap's steps plus the refused one),
# not the cap's steps after the restart.  A flow parked past a cap lowered
# while it waited fails when it is resumed: its worker loads it and finds it
# past the cap.
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
my $node = new_node('steps_cap', 'dwarf.max_flow_steps' => 40);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
-- goes to itself for ever; parks once, at its 15th step
CREATE FUNCTION app.loop(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'n')::int, 0) + 1;
BEGIN
	IF n = 15 AND dwarf.interrupt('{"at": 15}') IS NULL THEN
		RETURN '{}';
	END IF;
	PERFORM dwarf.goto('Loop');
	RETURN jsonb_build_object('n', n);
END $$;
SELECT dwarf.define('loop', '{"entry": "Loop", "tasks": {"Loop": "app.loop"},
  "transitions": [{"from": "Loop", "to": "Loop", "goto": true}]}');
});

my $a = $node->safe_psql('postgres', q{SELECT dwarf.create('loop', '{}')});
my $b = $node->safe_psql('postgres', q{SELECT dwarf.create('loop', '{}')});
for my $id ($a, $b)
{
	is($node->safe_psql('postgres', "SELECT status FROM dwarf.await($id, '60 s')"),
		'interrupted', "flow $id parks at its 15th step");
}
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.step WHERE flow_id = $a"),
	'15', 'it has 15 step rows');

$node->restart;
wait_for_workers($node, 'the workers are back after the restart');

$node->safe_psql('postgres', "SELECT dwarf.resume($a, '\"go on\"')");
is($node->safe_psql('postgres', "SELECT status || ': ' || error FROM dwarf.await($a, '60 s')"),
	'failed: the flow has taken 40 steps, the most dwarf.max_flow_steps allows',
	'resumed after the restart, the flow fails on the cap');
is($node->safe_psql('postgres',
		"SELECT count(*) || ' rows, ' || count(*) FILTER (WHERE status = 'completed') || ' completed, '"
		. " || string_agg(status, ',' ORDER BY step_id) FILTER (WHERE status <> 'completed')"
		. " FROM dwarf.step WHERE flow_id = $a"),
	'41 rows, 38 completed, interrupted,resumed,failed',
	'the steps before the restart counted: 40 steps and the refused one');

# The cap lowered below what the parked flow has taken: it fails once loaded.
$node->safe_psql('postgres', 'ALTER SYSTEM SET dwarf.max_flow_steps = 10');
$node->restart;
wait_for_workers($node, 'the workers are back after the second restart');
is($node->safe_psql('postgres', "SELECT status FROM dwarf.await($b, '0 s')"),
	'interrupted', 'the flow parked past the lowered cap is still parked');
$node->safe_psql('postgres', "SELECT dwarf.resume($b, '\"go on\"')");
is($node->safe_psql('postgres', "SELECT status || ': ' || error FROM dwarf.await($b, '60 s')"),
	'failed: the flow has taken 10 steps, the most dwarf.max_flow_steps allows',
	'resumed, a flow past a lowered cap fails as its worker loads it');
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.step WHERE flow_id = $b"),
	'15', 'and takes no further step');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
