# Copyright: dwarf project.
#
# 130_dump_restore.pl: pg_dump of a database that uses dwarf, restored
# into new databases with pg_restore, carries on every flow.
#
# The source database "src" has four graphs and flows of every kind:
# completed flows archived by dwarf.maintain() (so the archive has day
# partitions), completed flows still live, an interrupted flow, and a flow
# whose task called dwarf.sleep('3 s').  Its step log holds every kind of
# partition, made at run time by dwarf.maintain (with
# dwarf.segment_interval = '1 s', so that a few flows pass a segment):
# live segments attached to dwarf.step_log (the sleeping flow's steps), archived
# segments attached to dwarf.step_log_archive (the archived flows' steps, the
# live completed flows' steps in a segment handed over whole, and the
# steps of flows whose ids outran the segments, moved there from the
# default partition), and dwarf.step_default (the interrupted flow's steps,
# moved there when its segment went to the archive without it).  Every task writes a row to an
# application table, app.log, whose primary key (flow, task) fails the step
# of a task that would run twice.  The sleeping flow's next task, G, waits
# for an advisory lock that a session holds in "src" only, so that the dump
# finds the flow still asleep (or about to run G) however slow the machine.
#
# pg_dump -Fc is restored three ways, each into a new database:
#   - "dst_split": pg_restore --section=pre-data, then (once the new
#     database's workers have made their first scan) the data and post-data
#     sections in a second pg_restore: the rows come in while the workers
#     run, each table in a transaction of its own;
#   - "dst_jobs": the same with the data and post-data sections restored by
#     pg_restore --jobs=2;
#   - "dst_one": pg_restore --single-transaction.
# Each restore exits 0 with nothing on stderr (the archive's day partitions
# and the step log's segments, their indexes and triggers restore as they
# are).  In each restored database: the graphs, every flow (live and
# archived, in the same day partition), every step row (in the same
# partition: segment or default, live or archived), the partitions' indexes
# (an archive day's B-tree by id among them), dwarf.segment, each flow's
# dwarf.history and app.log are what the source had; reads of an archived
# flow use the day partition's B-tree and the segment's index (EXPLAIN); the
# sleeping flow wakes and completes with nobody's help, its tasks run once;
# the interrupted flow resumes (dwarf.resume) and completes; and a new
# flow's id, its steps' ids and a new graph's id are above every restored
# one.
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
my $node = new_node('dump_restore', max_worker_processes => 24);
my $GATE = 4242;    # the advisory lock task G waits for

$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', qq{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE TABLE app.log (flow_id bigint, task text, PRIMARY KEY (flow_id, task));
CREATE FUNCTION app.work(task text) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	INSERT INTO app.log VALUES (dwarf.flow_id(), task);
	RETURN jsonb_build_object('n', 1, 'trail', task);
END \$\$;
CREATE FUNCTION app.a(s jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT app.work('A') \$\$;
CREATE FUNCTION app.b(s jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT app.work('B') \$\$;
CREATE FUNCTION app.c(s jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT app.work('C') \$\$;
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM dwarf.sleep('3 s');
	RETURN app.work('N');
END \$\$;
CREATE FUNCTION app.gate(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM pg_advisory_xact_lock($GATE);
	RETURN app.work('G');
END \$\$;
CREATE FUNCTION app.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
DECLARE answer jsonb := dwarf.interrupt('{"question": "go on?"}');
BEGIN
	IF answer IS NULL THEN
		RETURN '{}';
	END IF;
	RETURN app.work('Q') || jsonb_build_object('answer', answer);
END \$\$;
SELECT dwarf.define('chain', '{"tasks": {"A": "app.a", "B": "app.b", "C": "app.c"},
  "transitions": [{"chain": ["A", "B", "C", "END"]}], "reducers": {"n": "add", "trail": "append"}}');
SELECT dwarf.define('napper', '{"tasks": {"A": "app.a", "N": "app.nap", "G": "app.gate"},
  "transitions": [{"chain": ["A", "N", "G", "END"]}], "reducers": {"n": "add", "trail": "append"}}');
SELECT dwarf.define('asker', '{"tasks": {"A": "app.a", "Q": "app.ask", "C": "app.c"},
  "transitions": [{"chain": ["A", "Q", "C", "END"]}], "reducers": {"n": "add", "trail": "append"}}');
CREATE FUNCTION app.tick(s jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT '{"tick": 1}'::jsonb \$\$;
SELECT dwarf.define('tick', '{"tasks": {"T": "app.tick"}, "transitions": []}');
});

# ---------------------------------------------------------------- the source
my $NARCHIVED = 4;
my $NLIVE     = 3;
$node->safe_psql('src', q{ALTER DATABASE src SET dwarf.segment_interval = '1 s'});
is( $node->safe_psql('src', qq{
SET statement_timeout = '90 s';
SELECT string_agg(r.status, ',')
  FROM generate_series(1, $NARCHIVED) i, LATERAL dwarf.run('chain', jsonb_build_object('i', i)) r;
SET dwarf.archive_after = '0';
SELECT dwarf.maintain() ->> 'moved_flows';
SELECT string_agg(r.status, ',')
  FROM generate_series(1, $NLIVE) i, LATERAL dwarf.run('chain', jsonb_build_object('i', 10 + i)) r;
SELECT status FROM dwarf.run('asker', '{}');}),
	join(',', ('completed') x $NARCHIVED) . "\n$NARCHIVED\n"
	  . join(',', ('completed') x $NLIVE) . "\ninterrupted",
	"$NARCHIVED completed flows archived, $NLIVE completed flows live, one flow interrupted");

# Flows of graph "tick" until the ids pass both segments the first pass
# made ahead; the last few have their steps in dwarf.step_default.
my $ticks = $node->safe_psql('src', q{
SELECT max(hi) - dwarf_internal.next_flow_id() + 5 FROM dwarf.segment WHERE live});
$node->safe_psql('src', "SELECT dwarf.create('tick', '{}') FROM generate_series(1, $ticks)");
ok( $node->poll_query_until('src', q{SELECT count(*) FROM dwarf.flow WHERE status = 'running'}, '0'),
	"$ticks flows of tick completed");
is( $node->safe_psql('src', q{
SELECT count(DISTINCT s.flow_id) FROM dwarf.step_default s
 WHERE s.flow_id >= (SELECT max(hi) FROM dwarf.segment)}),
	'5', 'the steps of the 5 flows past the segments are in dwarf.step_default');

# A pass once the interrupted flow's segment has spanned twice
# dwarf.segment_interval: it hands both segments to the archive (the
# interrupted flow's steps moved to dwarf.step_default), makes a new
# archived segment for the ids past them and new live segments at the
# next id; the pass after it archives the default's steps of those ids
# there.  No flow row moves.
ok( $node->poll_query_until('src', q{
SELECT made_at < now() - interval '2 s' FROM dwarf.segment
 WHERE (SELECT f.id FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'asker')
       BETWEEN lo AND hi - 1}),
	'the interrupted flow\'s segment has spanned twice dwarf.segment_interval');
my $pass = $node->safe_psql('src', q{SET dwarf.archive_after = '1 h'; SELECT dwarf.maintain()});
note "second pass: $pass";
is( $node->safe_psql('src', qq{
SELECT jsonb_array_length(r->'segments_archived') || ' ' || jsonb_array_length(r->'segments_made') || ' '
       || (r->>'moved_flows') || ' ' || (r->>'moved_steps')
  FROM (SELECT \$\$$pass\$\$::jsonb AS r) x}),
	'2 3 0 14', 'the pass archived 2 segments, made 3 and moved 14 steps (the 12 of the archived chains, '
	  . 'which the first pass left in the default partition under the segment it made, and the interrupted flow\'s 2)');
# The next pass moves the default's steps under the segment the pass made
# for the ids past the old ones (before its handovers, so one pass later).
$pass = $node->safe_psql('src', q{SET dwarf.archive_after = '1 h'; SELECT dwarf.maintain()});
note "third pass: $pass";
is( $node->safe_psql('src', qq{SELECT (r->>'moved_flows') || ' ' || (r->>'moved_steps')
  FROM (SELECT \$\$$pass\$\$::jsonb AS r) x}),
	'0 5', 'the next pass moved the 5 ticks\' steps into the archived segment');

my $gate = $node->background_psql('src');
$gate->query_safe("SELECT pg_advisory_lock($GATE)");
my $napper = $node->safe_psql('src', q{SELECT dwarf.create('napper', '{}')});
ok( $node->poll_query_until('src',
		"SELECT count(*) FROM dwarf.step WHERE flow_id = $napper AND task = 'N'", '1'),
	'the napper flow went to sleep after its task N');
my $asker = $node->safe_psql('src', q{
SELECT f.id FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'asker'});

# Where each kind of flow has its steps.
is( $node->safe_psql('src', q{
SELECT string_agg(DISTINCT gr.name || ' ' || CASE WHEN f.place = 'archived' THEN 'archived' ELSE 'live' END
                  || ' flow: ' || CASE WHEN s.tableoid = 'dwarf.step_default'::regclass THEN 'dwarf.step_default'
                                       WHEN sg.live THEN 'live segment' ELSE 'archived segment' END, ', ')
  FROM (SELECT tableoid, flow_id FROM dwarf.step_log UNION ALL SELECT tableoid, flow_id FROM dwarf.step_log_archive) s
  JOIN (SELECT 'live' AS place, id, graph_id FROM dwarf.flow
        UNION ALL SELECT 'archived', id, graph_id FROM dwarf.flow_archive) f ON f.id = s.flow_id
  JOIN dwarf.graph gr ON gr.id = f.graph_id
  LEFT JOIN dwarf.segment sg ON s.tableoid = ('dwarf.' || sg.relation)::regclass}),
	'asker live flow: dwarf.step_default, chain archived flow: archived segment, '
	  . 'chain live flow: archived segment, napper live flow: live segment, tick live flow: archived segment',
	'the steps are in every kind of partition: live and archived segments, and the default');

# The archived flows' day gets the B-tree by id that a pass builds a day
# once the day is past (made here as the pass makes it: the day is today).
$node->safe_psql('src', q{
DO $$
DECLARE
	part text := (SELECT c.relname FROM dwarf.flow_archive f JOIN pg_class c ON c.oid = f.tableoid LIMIT 1);
BEGIN
	EXECUTE format('CREATE INDEX %I ON dwarf.%I (id)', part || '_id_btree', part);
END $$});

# What a restored database must hold: everything in "src" but the napper
# flow, which moves on; its steps so far are checked on their own.
my %reads = (
	graphs => q{
SELECT string_agg(format('%s %s %s %s %s', id, name, version, definition, owner), E'\n' ORDER BY id)
  FROM dwarf.graph},
	flows => qq{
SELECT string_agg(f.part || ' ' || to_jsonb(f)::text, E'\n' ORDER BY f.id)
  FROM (SELECT tableoid::regclass AS part, * FROM dwarf.flow
        UNION ALL SELECT tableoid::regclass, * FROM dwarf.flow_archive) f
 WHERE f.id <> $napper},
	steps => qq{
SELECT string_agg(s.part || ' ' || to_jsonb(s)::text, E'\n' ORDER BY s.flow_id, s.first_step)
  FROM (SELECT tableoid::regclass AS part, * FROM dwarf.step_log
        UNION ALL SELECT tableoid::regclass, * FROM dwarf.step_log_archive) s
 WHERE s.flow_id <> $napper},
	partitions => q{
SELECT string_agg(format('%s of %s: %s %s', c.oid::regclass, i.inhparent::regclass,
                         pg_get_expr(c.relpartbound, c.oid), c.reloptions), E'\n' ORDER BY c.relname)
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent IN ('dwarf.step_log'::regclass, 'dwarf.step_log_archive'::regclass, 'dwarf.flow_archive'::regclass)},
	indexes => q{
SELECT string_agg(pg_get_indexdef(x.indexrelid), E'\n' ORDER BY pg_get_indexdef(x.indexrelid))
  FROM pg_index x JOIN pg_inherits i ON i.inhrelid = x.indrelid
 WHERE i.inhparent IN ('dwarf.step_log'::regclass, 'dwarf.step_log_archive'::regclass, 'dwarf.flow_archive'::regclass)},
	segments => q{
SELECT string_agg(to_jsonb(s)::text, E'\n' ORDER BY s.lo) FROM dwarf.segment s},
	history => qq{
SELECT string_agg(f.id || ' ' || (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.step_id)
                                    FROM dwarf.history(f.id) h)::text, E'\n' ORDER BY f.id)
  FROM dwarf.flow_all f WHERE f.id <> $napper},
	app => qq{
SELECT string_agg(flow_id || ' ' || task, E'\n' ORDER BY flow_id, task)
  FROM app.log WHERE NOT (flow_id = $napper AND task = 'G')},
	napper => qq{
SELECT string_agg(task || ' ' || status, ',' ORDER BY step_id) FROM dwarf.step WHERE flow_id = $napper});
my %before = map { $_ => $node->safe_psql('src', $reads{$_}) } keys %reads;
is($before{napper}, 'A completed,N completed', 'the napper flow has run A and N');
my ($max_flow, $max_step, $nsteps, $max_graph) = split /\|/, $node->safe_psql('src', q{
SELECT (SELECT max(id) FROM dwarf.flow_all) || '|' || (SELECT max(step_id) || '|' || count(*) FROM dwarf.step_all)
       || '|' || (SELECT max(id) FROM dwarf.graph)});
is( $node->safe_psql('src', q{
SELECT (SELECT count(*) FROM dwarf.flow) || ' ' || (SELECT count(*) FROM dwarf.flow_archive) || ' '
       || (SELECT count(*) FROM dwarf.step) || ' ' || (SELECT count(*) FROM dwarf.step_archive)}),
	($NLIVE + 2 + $ticks) . " $NARCHIVED 4 " . (3 * $NARCHIVED + 3 * $NLIVE + $ticks),
	'the source has live and archived flows, steps in dwarf.step (the napper\'s 2, the asker\'s 2) '
	  . 'and the others\' in dwarf.step_archive');

# ---------------------------------------------------------------- the dump
my $dump = PostgreSQL::Test::Utils::tempdir() . '/src.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', 'src' ], 'pg_dump -Fc of the source');
is_deeply({ map { $_ => $node->safe_psql('src', $reads{$_}) } keys %reads },
	\%before, 'the source did not change while it was dumped');

# ---------------------------------------------------------------- the restores

# restore_ok($db, @runs): creates $db and runs each pg_restore (an array of
# its options) into it; each exits 0 and writes nothing.  With split => 1
# in the first, the second waits until the new database's workers run and
# have made their first scan.
sub restore_ok
{
	my ($db, @runs) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	for my $i (0 .. $#runs)
	{
		if ($i > 0)
		{
			ok( $node->poll_query_until('postgres', qq{
SELECT count(*) FROM pg_stat_activity
 WHERE backend_type = 'dwarf worker' AND datname = '$db' AND wait_event = 'Extension'}, '2'),
				"$db: its two workers wait for work");
		}
		$node->command_checks_all(
			[ 'pg_restore', @{ $runs[$i] }, '-d', $db, $dump ],
			0, [qr/\A\z/], [qr/\A\z/],
			"$db: pg_restore @{ $runs[$i] } exits 0 and writes nothing");
	}
}

# check_restored($db): everything a restored database must show.
sub check_restored
{
	my ($db) = @_;

	for my $what (qw(graphs flows steps partitions indexes segments history app))
	{
		is($node->safe_psql($db, $reads{$what}), $before{$what},
			"$db: $what are those of the source");
	}

	# An archived flow's reads use its day partition's and its segment's
	# indexes (the day's B-tree by id, restored with it).
	my $archived = $node->safe_psql($db, q{SELECT id FROM dwarf.flow_archive ORDER BY id LIMIT 1});
	for my $sql (
		"SELECT f.finished_at FROM dwarf.flow_archive f WHERE f.id = $archived",
		"SELECT * FROM dwarf.step_archive s WHERE s.flow_id = $archived")
	{
		my $plan = $node->safe_psql($db, "SET enable_seqscan = off; EXPLAIN (COSTS OFF) $sql");
		ok($plan =~ /Index/ && $plan !~ /Seq Scan/, "$db: an index finds an archived flow: $sql")
		  or diag $plan;
		like($plan, qr/_id_btree/, "$db: the archived flow's day finds it by its B-tree")
		  if $sql =~ /flow_archive/;
	}

	# The sleeping flow wakes and completes; each of its tasks ran once.
	is( $node->safe_psql($db, qq{
SET statement_timeout = '90 s';
SELECT status || ' ' || (state->>'n') || ' ' || (state->'trail')::text FROM dwarf.await($napper, '60 s');
SELECT string_agg(task || ' ' || status, ',' ORDER BY step_id) FROM dwarf.history($napper);
SELECT string_agg(task, ',' ORDER BY task) FROM app.log WHERE flow_id = $napper;}),
		qq{completed 3 ["A", "N", "G"]\nA completed,N completed,G completed\nA,G,N},
		"$db: the sleeping flow woke up and completed, each task once");

	# The interrupted flow resumes and completes.
	is( $node->safe_psql($db, qq{
SET statement_timeout = '90 s';
SELECT dwarf.resume($asker, '"yes"');
SELECT status || ' ' || (state->>'answer') || ' ' || (state->'trail')::text FROM dwarf.await($asker, '60 s');
SELECT string_agg(task, ',' ORDER BY task) FROM app.log WHERE flow_id = $asker;}),
		qq{\ncompleted yes ["A", "Q", "C"]\nA,C,Q},
		"$db: the interrupted flow resumed and completed");

	# New ids are above the restored ones.
	my $new = $node->safe_psql($db, q{
SET statement_timeout = '90 s';
SELECT flow_id || ' ' || status FROM dwarf.run('chain', '{"new": true}')});
	my ($new_id, $new_status) = split / /, $new;
	is($new_status, 'completed', "$db: a new flow completes");
	cmp_ok($new_id, '>', $max_flow, "$db: the new flow's id is above every restored one");
	cmp_ok($node->safe_psql($db, "SELECT dwarf.create('chain', '{}')"), '>', $new_id,
		"$db: dwarf.create's next id is above it too");
	is( $node->safe_psql($db, qq{
SELECT count(*) FILTER (WHERE step_id <= $max_step) || ' ' || (count(*) > $nsteps)
  FROM dwarf.step_all}),
		"$nsteps true",
		"$db: the steps run after the restore have ids above every restored one");
	my @define = split /\n/, $node->safe_psql($db, q{
SELECT dwarf.define('chain', '{"tasks": {"A": "app.a"}, "transitions": []}');
SELECT max(id) FROM dwarf.graph});
	cmp_ok($define[-1], '>', $max_graph, "$db: a new graph version's id is above every restored one");

	is( $node->safe_psql($db, q{
SELECT (SELECT count(*) FROM dwarf.flow_all WHERE status NOT IN ('completed', 'running'))
       || ' ' || (SELECT count(*) FROM dwarf.step_all WHERE status = 'failed' OR error IS NOT NULL)}),
		'0 0', "$db: no flow failed and no step failed (no task ran twice)");
}

restore_ok('dst_split', [ '--section=pre-data' ], [ '--section=data', '--section=post-data' ]);
restore_ok('dst_jobs', [ '--section=pre-data' ],
	[ '--section=data', '--section=post-data', '--jobs=2' ]);
restore_ok('dst_one', [ '--single-transaction' ]);
check_restored($_) for qw(dst_split dst_jobs dst_one);

$gate->query_safe("SELECT pg_advisory_unlock($GATE)");
$gate->quit;
is( $node->safe_psql('src', qq{
SET statement_timeout = '90 s';
SELECT status FROM dwarf.await($napper, '60 s')}),
	'completed', 'in the source, the napper flow completes once the gate opens');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
