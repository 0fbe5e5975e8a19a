# Copyright: dwarf project.
#
# 189_step_segments.pl: the step log is written once.  dwarf.step_log is
# partitioned by flow id into segments that dwarf.maintain makes ahead of
# the ids, hands to dwarf.step_log_archive whole once their flows have closed
# (the same table, detached and attached: no row copied) and drops after
# dwarf.retention; the few steps of flows that outlive their segment are
# the only ones moved.
#
#  1. Before any pass every step goes to dwarf.step_default; the first pass
#     makes a live segment at the next flow id, one after it, and an
#     archived one for the ids before, into which the next pass moves the
#     default's steps of closed flows.
#  2. Flows created then write their steps into their segment (the
#     workers route each row by its flow id).
#  3. Once the ids have passed a segment and its flows have all closed, a
#     pass hands it to the archive: the same relation (its relfilenode is
#     unchanged), its rows in place, no step moved, dwarf.history reads
#     them.
#  4. A segment whose flows are closed but one (interrupted) waits; once it
#     has spanned twice dwarf.segment_interval it goes too, and that flow's
#     steps move to dwarf.step_default, where its next steps go; when it
#     closes, a pass moves them into the archived segment.  Its history is
#     whole throughout.
#  5. dwarf.maintain_at past the retention drops the archived segments
#     whole, not while a flow of theirs is open.
#  6. A segment has autovacuum off and a CHECK constraint on its range;
#     dwarf.storage counts the live and archived segments.
#  7. A burst that outruns the segments between two passes goes to
#     dwarf.step_default; the next pass makes an archived segment for its
#     ids and a live one sized by the rate the ids went at.
#  8. dwarf.delete during a move of its flow's steps leaves none behind.
#  9. Nor does dwarf.purge.
# 10. A fresh install's first pass, before any flow id was handed out,
#     makes segments doubling in width ahead of the first, so that a load
#     starting after it finds segments made; they stay through passes
#     before any flow, and the first pass after flows came drops those
#     beyond the one after the current, but
#     never one that holds a step or covers a flow (a restore into a
#     server whose ids start lower brings such segments above the ids).
#
# Every wait polls with a deadline; nothing is timed.
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
my $node = new_node('segments', 'dwarf.segment_interval' => "'1 s'",
	'dwarf.archive_after' => "'1 h'");

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.one(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"n": 1}'::jsonb $$;
CREATE FUNCTION app.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF dwarf.interrupt('{"why": "approval"}') IS NULL THEN RETURN NULL; END IF;
	RETURN '{"n": 1}';
END $$;
SELECT dwarf.define('three', '{"tasks": {"A": "app.one", "B": "app.one", "C": "app.one"},
  "transitions": [{"chain": ["A", "B", "C", "END"]}], "reducers": {"n": "add"}}');
SELECT dwarf.define('asks', '{"tasks": {"A": "app.one", "Q": "app.ask", "C": "app.one"},
  "transitions": [{"chain": ["A", "Q", "C", "END"]}], "reducers": {"n": "add"}}');
});
wait_for_workers($node, 'the workers run');

# create_and_wait($n): $n flows of graph "three", waited for; their ids.
sub create_and_wait
{
	my ($n) = @_;
	my $ids = $node->safe_psql('postgres',
		"SELECT string_agg(dwarf.create('three', '{}')::text, ',') FROM generate_series(1, $n)");
	ok( $node->poll_query_until('postgres',
			"SELECT count(*) FROM dwarf.flow WHERE id IN ($ids) AND status = 'completed'", $n),
		"$n flows complete");
	return $ids;
}

# 1. Before any pass: the default partition.
my $early = create_and_wait(20);
is( $node->safe_psql('postgres', qq{
SELECT string_agg(DISTINCT tableoid::regclass::text, ',') || ' ' || sum(cardinality(step_id))
  FROM dwarf.step_log WHERE flow_id IN ($early)}),
	'dwarf.step_default 60', 'before any pass, the steps are in dwarf.step_default');

my $pass = $node->safe_psql('postgres', q{SELECT dwarf.maintain()});
note "first pass: $pass";
is( $node->safe_psql('postgres', q{
SELECT string_agg(live::text, ',' ORDER BY lo) || ' '
       || bool_and(hi > lo) || ' '
       || (SELECT count(*) FROM dwarf.segment s WHERE s.live
              AND s.lo <= dwarf_internal.next_flow_id() AND dwarf_internal.next_flow_id() < s.hi)
  FROM dwarf.segment}),
	'false,true,true true 1',
	'the first pass made an archived segment for the ids before, the live one the next flow goes to, and one after it');
$pass = $node->safe_psql('postgres', q{SELECT dwarf.maintain()});
is( $node->safe_psql('postgres', qq{
SELECT (SELECT count(*) FROM dwarf.step_default) || ' '
       || (SELECT count(*) FROM dwarf.step_archive WHERE flow_id IN ($early))
       || ' ' || ('$pass'::jsonb->>'moved_steps')}),
	'0 60 60', 'the next pass moved the default partition\'s steps of closed flows into the archived segment');

# 2. New flows write into their live segment.
my $batch1 = create_and_wait(30);
is( $node->safe_psql('postgres', qq{
SELECT sum(cardinality(s.step_id)) || ' ' || bool_and(g.live) || ' ' || count(DISTINCT g.relation)
  FROM dwarf.step_log s
  JOIN dwarf.segment g ON s.tableoid = ('dwarf.' || g.relation)::regclass
 WHERE s.flow_id IN ($batch1)}),
	'90 true 1', 'the steps of flows created later are in their live segment');

# A flow that parks: it will outlive its segment.
my $parked = $node->safe_psql('postgres', q{SELECT dwarf.create('asks', '{}')});
ok( $node->poll_query_until('postgres',
		"SELECT status FROM dwarf.flow WHERE id = $parked", 'interrupted'),
	'a flow of graph "asks" parks on its interrupt');

# 3. Enough flows to pass the current segment and the one after it.
my ($seg1, $seg1_node) = split /\|/, $node->safe_psql('postgres', qq{
SELECT g.relation || '|' || c.relfilenode FROM dwarf.segment g JOIN pg_class c ON c.relname = g.relation
 WHERE $parked >= g.lo AND $parked < g.hi});
my $width = $node->safe_psql('postgres', "SELECT hi - lo FROM dwarf.segment WHERE relation = '$seg1'");
my $next_seg = $node->safe_psql('postgres',
	"SELECT relation FROM dwarf.segment WHERE lo = (SELECT hi FROM dwarf.segment WHERE relation = '$seg1')");
# The passes until part 4 count dwarf.segment_interval as an hour, so
# that the parked flow's segment has not spanned twice the interval.
my $hour = q{SET dwarf.segment_interval = '1 h'; SELECT dwarf.maintain()};
my $filler = create_and_wait($width + 10);
$pass = $node->safe_psql('postgres', $hour);
note "pass with one segment full: $pass";
is( $node->safe_psql('postgres', "SELECT live FROM dwarf.segment WHERE relation = '$seg1'"),
	't', 'a passed segment with a flow still open stays live while young');

# The segment after it holds only closed flows once ids pass it too.
my $more = create_and_wait(
	$node->safe_psql('postgres', "SELECT hi - lo FROM dwarf.segment WHERE relation = '$next_seg'") + 10);
my $next_node = $node->safe_psql('postgres', "SELECT relfilenode FROM pg_class WHERE relname = '$next_seg'");
my $next_rows = $node->safe_psql('postgres', "SELECT count(*) FROM dwarf.$next_seg");
$pass = $node->safe_psql('postgres', $hour);
note "pass with a closed segment: $pass";
is( $node->safe_psql('postgres', qq{
SELECT g.live || ' ' || (c.relfilenode = $next_node) || ' '
       || (SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid) || ' '
       || (SELECT count(*) FROM dwarf.step_log_archive a WHERE a.tableoid = c.oid)
  FROM dwarf.segment g JOIN pg_class c ON c.relname = g.relation WHERE g.relation = '$next_seg'}),
	"false true dwarf.step_log_archive $next_rows",
	'a segment whose flows all closed went to the archive as the same relation, with all its rows');
is( $node->safe_psql('postgres', qq{SELECT result->>'moved_steps' FROM dwarf.maintain_log
  ORDER BY started_at DESC LIMIT 1}), '0', 'and moved no step');
is( $node->safe_psql('postgres', "SELECT live FROM dwarf.segment WHERE relation = '$seg1'"),
	't', 'the parked flow\'s segment is still live');
my $one = (split /,/, $more)[0];
is( $node->safe_psql('postgres', "SELECT string_agg(task, '' ORDER BY step_id) FROM dwarf.history($one)"),
	'ABC', 'dwarf.history reads an archived segment\'s flow');

# 4. The open flow's segment goes once it has spanned twice the interval.
ok( $node->poll_query_until('postgres', qq{
SELECT made_at < now() - interval '2 s' FROM dwarf.segment WHERE relation = '$seg1'}),
	'the parked flow\'s segment has spanned twice dwarf.segment_interval');
$pass = $node->safe_psql('postgres', q{SELECT dwarf.maintain()});
note "pass with an outliving flow: $pass";
is( $node->safe_psql('postgres', qq{
SELECT g.live || ' ' || (c.relfilenode = $seg1_node) || ' ' || ('$pass'::jsonb->>'moved_steps')
  FROM dwarf.segment g JOIN pg_class c ON c.relname = g.relation WHERE g.relation = '$seg1'}),
	'false true 2', 'the segment went to the archive, and the parked flow\'s 2 steps were moved');
is( $node->safe_psql('postgres', qq{
SELECT string_agg(l.tableoid::regclass::text || ':' || u.task, ',' ORDER BY u.step_id)
  FROM dwarf.step_log l, unnest(l.step_id, l.task) u(step_id, task) WHERE l.flow_id = $parked}),
	'dwarf.step_default:A,dwarf.step_default:Q', 'its steps are in dwarf.step_default');
$node->safe_psql('postgres', "SELECT dwarf.resume($parked, '{}')");
ok( $node->poll_query_until('postgres', "SELECT status FROM dwarf.flow WHERE id = $parked", 'completed'),
	'the parked flow resumes and completes');
is( $node->safe_psql('postgres', "SELECT string_agg(task || '=' || status, ',' ORDER BY step_id) FROM dwarf.history($parked)"),
	'A=completed,Q=interrupted,Q=resumed,Q=completed,C=completed',
	'its history is whole');
$pass = $node->safe_psql('postgres', q{SELECT dwarf.maintain()});
is( $node->safe_psql('postgres', qq{
SELECT (SELECT coalesce(sum(cardinality(step_id)), 0) FROM dwarf.step_default) || ' '
       || (SELECT sum(cardinality(step_id)) FROM dwarf.$seg1 WHERE flow_id = $parked)}),
	'0 5', 'once it closed, a pass moved its steps into the archived segment');
is( $node->safe_psql('postgres', "SELECT string_agg(task, '' ORDER BY step_id) FROM dwarf.history($parked)"),
	'AQQQC', 'and its history reads the same');

# 6. What a segment is.
is( $node->safe_psql('postgres', qq{
SELECT c.reloptions::text || ' ' || count(k.conname)
  FROM pg_class c LEFT JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'c'
 WHERE c.relname = '$seg1' GROUP BY c.reloptions}),
	'{autovacuum_enabled=false} 1',
	'a segment has autovacuum off and a CHECK constraint on its range');
is( $node->safe_psql('postgres', q{
SELECT live_segments = (SELECT count(*) FROM dwarf.segment WHERE live)
   AND archived_segments = (SELECT count(*) FROM dwarf.segment WHERE NOT live)
   AND archived_segments >= 3 AND archive_step_bytes > 0 AND live_step_bytes > 0
  FROM dwarf.storage}),
	't', 'dwarf.storage counts the live and archived segments');

# 5. Retention: past it, archived segments are dropped whole, but not
# while a flow of theirs is open.
my $open = $node->safe_psql('postgres', q{SELECT dwarf.create('asks', '{}')});
ok( $node->poll_query_until('postgres', "SELECT status FROM dwarf.flow WHERE id = $open", 'interrupted'),
	'another flow parks');
my $open_seg = $node->safe_psql('postgres',
	"SELECT relation FROM dwarf.segment WHERE $open >= lo AND $open < hi");
my $archived = $node->safe_psql('postgres', 'SELECT count(*) FROM dwarf.segment WHERE NOT live');
$pass = $node->safe_psql('postgres', q{
SET dwarf.retention = '1 day';
SELECT dwarf_internal.maintain_at(now() + interval '3 days')});
note "pass past the retention: $pass";
is( $node->safe_psql('postgres', qq{
SELECT (SELECT count(*) FROM dwarf.segment WHERE NOT live) || ' '
       || (SELECT count(*) FROM pg_class c WHERE c.relname IN
             (SELECT jsonb_array_elements_text(\$\$$pass\$\$::jsonb->'segments_dropped')))}),
	'0 0', "past the retention, the $archived archived segments were dropped, tables and all");
is( $node->safe_psql('postgres', qq{SELECT live FROM dwarf.segment WHERE relation = '$open_seg'}),
	't', 'the live segment of the open flow stays');
is( $node->safe_psql('postgres', "SELECT string_agg(task, '' ORDER BY step_id) FROM dwarf.history($open)"),
	'AQ', 'and the open flow\'s history with it');

# 7. A burst that outruns the segments between two passes: its steps go to
# dwarf.step_default, and the next pass makes an archived segment for the
# ids it missed and a live one at the next id, sized by how fast the ids
# went since the newest segment was made (at least twice that many ids in
# an interval far longer than the time gone), not by the flows left in
# dwarf.flow, which the same pass archives (the old rule then fell back to
# the minimum, 16,384 ids for an hour).
my ($newest_lo, $top) = split /\|/, $node->safe_psql('postgres',
	q{SELECT lo || '|' || hi FROM dwarf.segment ORDER BY hi DESC LIMIT 1});
$node->safe_psql('postgres', qq{
SELECT setval('dwarf.flow_seq', $top + 20000 - dwarf_internal.flow_id_prefix())});
my $burst = create_and_wait(50);
my ($first_burst) = split /,/, $burst;
ok($first_burst > $top, 'the burst\'s ids are past every segment');
my $next_id = $node->safe_psql('postgres', 'SELECT dwarf_internal.next_flow_id()');
$pass = $node->safe_psql('postgres',
	q{SET dwarf.segment_interval = '1 h'; SET dwarf.archive_after = 0; SELECT dwarf.maintain()});
note "pass after the burst: $pass";
is( $node->safe_psql('postgres', qq{
SELECT (SELECT count(*) FROM dwarf.flow WHERE id IN ($burst)) || ' '
       || (SELECT sum(cardinality(step_id)) FROM dwarf.step_default WHERE flow_id IN ($burst)) || ' '
       || (SELECT string_agg(live::text, ',' ORDER BY lo) FROM dwarf.segment WHERE lo >= $top)}),
	'0 150 false,true,true', 'the pass archived the burst\'s flows (their steps still in the default) '
	  . 'and made an archived segment, a live one, and the one after it');
is( $node->safe_psql('postgres', qq{
SELECT lo = $top AND hi = $next_id FROM dwarf.segment WHERE lo = $top}),
	't', 'the archived one covers the ids the burst took');
my $live_width = $node->safe_psql('postgres', "SELECT hi - lo FROM dwarf.segment WHERE lo = $next_id");
cmp_ok($live_width, '>=', 2 * ($next_id - $newest_lo),
	"the live one ($live_width ids) is at least twice the ids gone since the newest segment was made");
is( $node->safe_psql('postgres', "SELECT hi - lo FROM dwarf.segment WHERE lo = $next_id + $live_width"),
	$live_width, 'and the one after it is as wide');
$pass = $node->safe_psql('postgres', q{SELECT dwarf.maintain()});
is( $node->safe_psql('postgres', qq{
SELECT (SELECT count(*) FROM dwarf.step_default WHERE flow_id IN ($burst)) || ' '
       || (SELECT sum(cardinality(a.step_id)) FROM dwarf.step_log_archive a
             JOIN dwarf.segment g ON a.tableoid = ('dwarf.' || g.relation)::regclass
            WHERE g.lo = $top AND a.flow_id IN ($burst))}),
	'0 150', 'the next pass moved the burst\'s steps into the archived segment');
is( $node->safe_psql('postgres', "SELECT string_agg(task, '' ORDER BY step_id) FROM dwarf.history($first_burst)"),
	'ABC', 'and dwarf.history reads them there');

# call_during_move($flow, $call): runs "SELECT $call" while a pass moves
# $flow's steps from the archive to the default partition (here by hand,
# in the same statements the pass runs), and commits the move once the
# call waits for it.
sub call_during_move
{
	my ($flow, $call) = @_;
	my ($function) = $call =~ /^([\w.]+)/;
	my $mover = $node->background_psql('postgres');
	$mover->query_safe(qq{
BEGIN;
SET LOCAL session_replication_role = replica;
WITH gone AS (DELETE FROM dwarf.step_log_archive WHERE flow_id = $flow RETURNING *)
INSERT INTO dwarf.step_default SELECT * FROM gone;});
	my $caller = $node->background_psql('postgres');
	$caller->query_until(qr/calling/, qq{\\echo calling\nSELECT $call;\n});
	ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) FROM pg_stat_activity
		 WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT $function%'}, '1'),
		"$function waits for the move of flow ${flow}'s steps");
	$mover->query_safe('COMMIT');
	$caller->query_safe('SELECT 1');
	$mover->quit;
	$caller->quit;
}

# 8. dwarf.delete during the move: it waits for the move, and then deletes
# the steps where they went, which its first statement's snapshot did not
# see.
my $moved = (split /,/, $burst)[1];
call_during_move($moved, "dwarf.delete($moved)");
is( $node->safe_psql('postgres', qq{
SELECT (SELECT count(*) FROM dwarf.step_all WHERE flow_id = $moved) || ' '
       || (SELECT count(*) FROM dwarf.flow_all WHERE id = $moved)}),
	'0 0', 'once the move committed, the delete left neither the flow nor a step of it');

# 9. dwarf.purge in the same window: it deletes the flow's steps again by
# the ids it purged, in a statement that sees where the move put them.
my $purged_one = (split /,/, $burst)[2];
call_during_move($purged_one, "dwarf.purge('0 s')");
is( $node->safe_psql('postgres', qq{
SELECT (SELECT count(*) FROM dwarf.flow_all WHERE id = $purged_one) || ' '
       || (SELECT count(*) FROM dwarf.step_all s
            WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id = s.flow_id))}),
	'0 0', 'once the move committed, the purge left neither the flow nor a step of any flow it purged');

# 10. A fresh install: in a database of its own.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', q{
CREATE EXTENSION dwarf;
CREATE FUNCTION one(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
SELECT dwarf.define('one', '{"tasks": {"A": "public.one"}, "transitions": [{"chain": ["A", "END"]}]}');
});
my $first = $node->safe_psql('fresh', 'SELECT dwarf.maintain()');
note "fresh install's first pass: $first";
my @live = map { [split /\|/] } split /\n/, $node->safe_psql('fresh',
	'SELECT lo, hi FROM dwarf.segment WHERE live ORDER BY lo');
my $doubling = 1;
for my $k (2 .. $#live)
{
	$doubling = 0
	  unless $live[$k][0] == $live[$k - 1][1]
	  && $live[$k][1] - $live[$k][0] == 2 * ($live[$k - 1][1] - $live[$k - 1][0]);
}
cmp_ok(scalar @live, '>', 2, 'the first pass of a fresh install made more than two live segments');
ok($doubling, 'each after the second twice as wide as the one before, with no gap');
cmp_ok($live[-1][1] - $live[0][0], '>=', 16777216, 'covering at least 16,777,216 flow ids');
is( $node->safe_psql('fresh', 'SELECT min(lo) = dwarf_internal.next_flow_id() FROM dwarf.segment WHERE live'),
	't', 'from the next flow id');

# after_pass($result): waits until over a second has gone since that pass
# read the next id, so that the next pass has a rate to go by.
sub after_pass
{
	my ($result) = @_;
	ok( $node->poll_query_until('fresh', qq{
		SELECT clock_timestamp() > ('$result'::jsonb->>'next_id_at')::timestamptz + interval '1.1 s'}),
		'over a second after the last pass');
}

# A pass before any flow (the ids went at 0 a second) keeps them all.
after_pass($first);
my $idle = $node->safe_psql('fresh', 'SELECT dwarf.maintain()');
is( $node->safe_psql('fresh', qq{
SELECT ('$idle'::jsonb->'segments_replaced')::text || ' ' || count(*) FROM dwarf.segment WHERE live}),
	'[] ' . scalar @live, 'a pass before any flow came dropped none of them');

# Flows come; the next pass, over a second later, sees the ids move.
$node->safe_psql('fresh', q{SELECT count(dwarf.create('one', '{}')) FROM generate_series(1, 100)});
after_pass($idle);
my $second = $node->safe_psql('fresh', 'SELECT dwarf.maintain()');
note "second pass: $second";
my $current_hi = $node->safe_psql('fresh', q{
SELECT hi FROM dwarf.segment WHERE live AND lo <= dwarf_internal.next_flow_id() AND dwarf_internal.next_flow_id() < hi});
my $beyond = join ',', map { "step_$_->[0]" } grep { $_->[0] > $current_hi } @live;
isnt($beyond, '', 'the first pass had made segments beyond the one after the one the ids are in now');
is( $node->safe_psql('fresh', qq{
SELECT (SELECT string_agg(r, ',' ORDER BY substr(r, 6)::bigint)
          FROM jsonb_array_elements_text('$second'::jsonb->'segments_replaced') r) || ' '
       || count(*) FILTER (WHERE lo > $current_hi) || ' '
       || count(*) FILTER (WHERE lo = $current_hi) || ' '
       || (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'dwarf' AND c.relname LIKE 'step\\_%' AND c.relkind = 'r'
              AND c.relname NOT IN (SELECT relation FROM dwarf.segment) AND c.relname <> 'step_default')
  FROM dwarf.segment WHERE live}),
	"$beyond 0 1 0",
	'the first pass after flows came dropped those, and only those: the one after the current is left, and no table of theirs');

# Segments above the ids, as a restore would bring: one with a step stays,
# an empty one goes.
$node->safe_psql('fresh', q{
SELECT dwarf_internal.make_step_segment(1000000000, 1000000064, true);
SELECT dwarf_internal.make_step_segment(2000000000, 2000000064, true);
SET session_replication_role = replica;
INSERT INTO dwarf.step_log (flow_id, first_step, last_step, step_id, token, task, status, attempt,
                            started_at, finished_at)
VALUES (1000000001, 1, 1, '{1}', '{0}', '{A}', '{completed}', '{1}', ARRAY[now()], ARRAY[now()]);
});
$node->safe_psql('fresh', q{SELECT dwarf.create('one', '{}')});
after_pass($second);
my $third = $node->safe_psql('fresh', 'SELECT dwarf.maintain()');
is( $node->safe_psql('fresh', qq{
SELECT ('$third'::jsonb->'segments_replaced')::text || ' '
       || (SELECT string_agg(relation, ',' ORDER BY lo) FROM dwarf.segment WHERE lo >= 1000000000) || ' '
       || (SELECT count(*) FROM dwarf.step WHERE flow_id = 1000000001)}),
	'["step_2000000000"] step_1000000000 1',
	'a segment above the ids that holds a step stays, with its step; an empty one is dropped');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
