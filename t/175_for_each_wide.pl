# Copyright: dwarf project.
#
# 175_for_each_wide.pl: a for_each is linear in its width, in the worker and
# on reload, and does not hold up the other flows of its worker.
#
#  - a for_each of 30,000 items completes within a bounded wait, with the
#    right final state: every branch's value added and appended in element
#    order, the for_each keys gone, the source array kept (each branch sees
#    its element, not the array);
#  - a second one is stopped with the server (immediate) once a third of its
#    branches have committed (the rest are slowed down until then); the
#    worker replays its rows and it completes, each branch's task run once
#    as far as the database can see;
#  - while a for_each of 10,000 slow-ish items runs, a short flow created
#    after it on the same worker (one worker) completes before the wide one
#    is half done: a flow has at most dwarf.batch_size steps queued at a
#    time, so its branches do not go before every later flow.
# Before this was linear, a for_each of 16,000 items took 86 s and 100,000
# did not finish; and a later flow waited for every branch of a wide one.
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
my $node = new_node(
	'for_each_wide',
	'dwarf.workers'        => 1,
	'dwarf.max_for_each'   => 50000,
	'dwarf.max_flow_steps' => 200000);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE TABLE app.ran (flow_id bigint, item int, PRIMARY KEY (flow_id, item));
CREATE TABLE app.pace (slow boolean);
INSERT INTO app.pace VALUES (true);
CREATE FUNCTION app.start(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.work(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF (s->>'item')::int > (s->>'slow_from')::int AND (SELECT slow FROM app.pace) THEN
		PERFORM pg_catalog.pg_sleep(0.0005);
	END IF;
	INSERT INTO app.ran VALUES (dwarf.flow_id(), (s->>'item')::int);
	RETURN jsonb_build_object('total', s->'item', 'results', s->'item',
							  'saw_items', s ? 'items');
END $$;
CREATE FUNCTION app.join(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('n', jsonb_array_length(s->'results')) $$;
CREATE FUNCTION app.short(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"short": true}'::jsonb $$;
SELECT dwarf.define('wide', '{"tasks": {"Start": "app.start", "Work": "app.work", "Join": "app.join"},
  "transitions": [{"from": "Start", "to": "Work", "for_each": "items", "as": "item"},
                  {"from": "Work", "to": "Join"}, {"from": "Join", "to": "END"}],
  "fan_in": ["Join"], "reducers": {"total": "add", "results": "append"}}');
SELECT dwarf.define('short', '{"tasks": {"S1": "app.short", "S2": "app.short"},
  "transitions": [{"chain": ["S1", "S2", "END"]}]}');
});
wait_for_workers($node, 'the worker is up', count => 1);

# A wide flow of n items; the tasks of items past slow_from sleep half a
# millisecond while app.pace says so.
sub create_wide
{
	my ($n, $slow_from) = @_;
	return $node->safe_psql('postgres',
		"SELECT dwarf.create('wide', jsonb_build_object('items',"
		  . " (SELECT jsonb_agg(i) FROM generate_series(1, $n) i), 'slow_from', $slow_from))");
}

# Checks a completed wide flow of n items: its state, and its tasks' rows.
sub check_wide
{
	my ($id, $n, $what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	is( $node->safe_psql(
			'postgres', qq{
SELECT status || ' total=' || (state->>'total') || ' n=' || (state->>'n')
	   || ' ordered=' || (state->'results' = (SELECT jsonb_agg(i) FROM generate_series(1, $n) i))
	   || ' items_kept=' || (state->'items' = (SELECT jsonb_agg(i) FROM generate_series(1, $n) i))
	   || ' each_keys=' || (state ?| ARRAY['item', 'itemIndex', 'itemCount'])
	   || ' branch_saw_items=' || (state->>'saw_items')
  FROM dwarf.await($id, '180 s')}),
		"completed total=" . ($n * ($n + 1) / 2) . " n=$n ordered=true items_kept=true"
		  . " each_keys=false branch_saw_items=false",
		"$what: completes with every branch folded in element order");
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) || ' ' || count(DISTINCT item) FROM app.ran WHERE flow_id = $id"),
		"$n $n",
		"$what: each branch's task ran once as far as the database can see");
}

# 1. Wide, at once.
my $wide = create_wide(30000, 30000);
check_wide($wide, 30000, 'a for_each of 30,000 items');

# 2. Wide, with a crash a third of the way: the replay of 10,000 rows.
my $crashed = create_wide(30000, 10000);
$node->poll_query_until('postgres',
	"SELECT count(*) >= 10000 FROM app.ran WHERE flow_id = $crashed")
  or die 'the second for_each never got a third of the way';
$node->stop('immediate');
start_after_immediate_stop($node, 'the server recovered from the immediate stop');
$node->safe_psql('postgres', 'UPDATE app.pace SET slow = false');
check_wide($crashed, 30000, 'a for_each of 30,000 items stopped a third of the way');

# 3. A short flow created after a wide one, on the same worker.
$node->safe_psql('postgres', 'UPDATE app.pace SET slow = true');
my $slow = create_wide(10000, 0);
$node->poll_query_until('postgres',
	"SELECT count(*) > 0 FROM dwarf.step WHERE flow_id = $slow AND task = 'Start'")
  or die 'the wide flow never started';
my $short = $node->safe_psql('postgres', q{SELECT dwarf.create('short', '{}')});
is($node->safe_psql('postgres', "SELECT status FROM dwarf.await($short, '180 s')"),
	'completed', 'the short flow completes');
my $done_then = $node->safe_psql('postgres',
	"SELECT count(*) FROM app.ran WHERE flow_id = $slow");
cmp_ok($done_then, '<', 5000,
	"the short flow did not wait for the wide one's branches ($done_then of 10,000 had run)");
check_wide($slow, 10000, 'the wide flow');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
