# Copyright: dwarf project.
#
# 188_step_rows.pl: a batch's step rows are buffered and written together
# (table_multi_insert, rows.c), and nothing can tell but the WAL.
#
# With one worker, so that a batch holds many flows' chained steps:
#  (a) a task in the middle of a 5-step chain that reads dwarf.history of
#      its own flow and dwarf.step directly sees exactly its 2 earlier
#      steps (the rows are still buffered when it starts: the read has them
#      written first);
#  (b) a batch with one failing step among many: the batch rolls back and
#      runs again with each step in a subtransaction; the failing task reads
#      its history first (buffered rows of the other flows are written under
#      its subtransaction, which then rolls back): every flow's step rows
#      are exactly the expected ones, none lost, none doubled;
#  (c) a plpgsql task with an EXCEPTION block that reads dwarf.step inside
#      the block and then rolls the block back: no row is lost with it;
#  (d) a burst of 500 ten-step flows writes its steps packed (fewer rows of
#      dwarf.step_log than steps) as Heap2/MULTI_INSERT records
#      (pg_walinspect between two LSNs), none as Heap/INSERT;
#  (e) a worker killed (SIGKILL) in the middle of a burst of ten-step flows:
#      after the crash restart every flow completes with exactly 10
#      completed steps, each task's write there once.
# All of it twice: with dwarf.step_log as the extension makes it, and with
# dwarf.step_log replaced by hand by a table partitioned by range of flow_id
# (two ranges, one with a CHECK on its range, and a default partition)
# whose ranges the flows of (a) and (b) straddle, so that one batch's rows
# go to several partitions.
#
# Determinism: every wait is a bounded poll of a condition; the kill happens
# once some steps of the burst have committed and flows are still running.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0 = time;

# The tasks and graphs.  Every task adds 1 to "n" (reducer add).
my $SETUP = q{
CREATE EXTENSION pg_walinspect;
CREATE SCHEMA app;
CREATE TABLE app.done (flow_id bigint, task text, PRIMARY KEY (flow_id, task));
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"n": 1}'::jsonb $$;
-- (a) its own flow's steps, as dwarf.history and dwarf.step show them
CREATE FUNCTION app.look(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	h int;
	d int;
BEGIN
	SELECT count(*) INTO h FROM dwarf.history(dwarf.flow_id());
	SELECT count(*) INTO d FROM dwarf.step WHERE flow_id = dwarf.flow_id();
	RETURN jsonb_build_object('n', 1, 'history', h, 'step', d);
END $$;
-- (b) reads its history, then fails for the flow whose input says so
CREATE FUNCTION app.maybe_fail(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	h int;
BEGIN
	SELECT count(*) INTO h FROM dwarf.history(dwarf.flow_id());
	IF (s->>'bad')::boolean THEN
		RAISE EXCEPTION 'flow % fails (it saw % steps)', dwarf.flow_id(), h;
	END IF;
	RETURN jsonb_build_object('n', 1, 'history', h);
END $$;
-- (c) a subtransaction that reads the step rows and rolls back
CREATE FUNCTION app.exc(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	inside int;
	after int;
BEGIN
	BEGIN
		SELECT count(*) INTO inside FROM dwarf.step WHERE flow_id = dwarf.flow_id();
		RAISE EXCEPTION 'undo the block';
	EXCEPTION WHEN raise_exception THEN
		NULL;
	END;
	SELECT count(*) INTO after FROM dwarf.step WHERE flow_id = dwarf.flow_id();
	RETURN jsonb_build_object('n', 1, 'inside', inside, 'after', after);
END $$;
-- (e) takes a moment and records itself by the n it was given (its place in
-- the chain): a second run of a step of a flow would fail on the primary key
CREATE FUNCTION app.slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.pg_sleep(0.002);
	INSERT INTO app.done VALUES (dwarf.flow_id(), coalesce(s->>'n', '0'));
	RETURN '{"n": 1}'::jsonb;
END $$;
SELECT dwarf.define('look', '{"tasks": {"s1": "app.noop", "s2": "app.noop", "look": "app.look",
                                        "s4": "app.noop", "s5": "app.noop"},
  "transitions": [{"chain": ["s1", "s2", "look", "s4", "s5", "END"]}], "reducers": {"n": "add"}}');
SELECT dwarf.define('fail', '{"tasks": {"f1": "app.noop", "f2": "app.maybe_fail", "f3": "app.noop"},
  "transitions": [{"chain": ["f1", "f2", "f3", "END"]}], "reducers": {"n": "add"}}');
SELECT dwarf.define('exc', '{"tasks": {"e1": "app.noop", "e2": "app.exc", "e3": "app.noop", "e4": "app.noop"},
  "transitions": [{"chain": ["e1", "e2", "e3", "e4", "END"]}], "reducers": {"n": "add"}}');
SELECT dwarf.define('ten', '{"tasks": {"t1": "app.noop", "t2": "app.noop", "t3": "app.noop",
  "t4": "app.noop", "t5": "app.noop", "t6": "app.noop", "t7": "app.noop", "t8": "app.noop",
  "t9": "app.noop", "t10": "app.noop"},
  "transitions": [{"chain": ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9", "t10", "END"]}],
  "reducers": {"n": "add"}}');
SELECT dwarf.define('tenslow', '{"tasks": {"t1": "app.slow", "t2": "app.slow", "t3": "app.slow",
  "t4": "app.slow", "t5": "app.slow", "t6": "app.slow", "t7": "app.slow", "t8": "app.slow",
  "t9": "app.slow", "t10": "app.slow"},
  "transitions": [{"chain": ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9", "t10", "END"]}],
  "reducers": {"n": "add"}}');
};

# dwarf.step_log replaced by a partitioned table with the same columns:
# flow ids below $b1 in step_low, from $b1 to $b2 in step_mid (which also
# has a CHECK of its range), the others in step_rest (the default), with a
# block-range index only.  The old table stays, renamed; the view that
# unpacks the step log, dwarf.step, is made again over the new one (its
# definition, which followed the rename, with the name put back).
sub partition_sql
{
	my ($b1, $b2) = @_;
	return qq{
ALTER TABLE dwarf.step_log RENAME TO step_log_plain;
CREATE TABLE dwarf.step_log (LIKE dwarf.step_log_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
	PARTITION BY RANGE (flow_id);
CREATE TABLE dwarf.step_low PARTITION OF dwarf.step_log FOR VALUES FROM (MINVALUE) TO ($b1);
CREATE TABLE dwarf.step_mid PARTITION OF dwarf.step_log FOR VALUES FROM ($b1) TO ($b2);
ALTER TABLE dwarf.step_mid ADD CONSTRAINT step_mid_range CHECK (flow_id >= $b1 AND flow_id < $b2);
CREATE TABLE dwarf.step_rest PARTITION OF dwarf.step_log DEFAULT;
CREATE INDEX step_flow ON dwarf.step_log USING brin (flow_id, first_step);
GRANT SELECT ON dwarf.step_log TO PUBLIC;
DO \$view\$ BEGIN
	EXECUTE 'CREATE OR REPLACE VIEW dwarf.step WITH (security_invoker = true) AS '
		|| replace(pg_get_viewdef('dwarf.step'::regclass), 'step_log_plain', 'step_log');
END \$view\$;
};
}

# create_flows($node, $graph, $n, $input_sql): creates $n flows of $graph in
# one statement (one batch for the worker); input from $input_sql, an
# expression of i (1..$n).  Returns the first and last flow id.
sub create_flows
{
	my ($node, $graph, $n, $input_sql) = @_;
	return split /\|/, $node->safe_psql('postgres',
		"SELECT min(id), max(id) FROM (SELECT dwarf.create('$graph', $input_sql) AS id
		                                 FROM generate_series(1, $n) i) f");
}

# flows_closed($node, $lo, $hi, $message): one test that waits until the
# flows with ids $lo..$hi are all closed.
sub flows_closed
{
	my ($node, $lo, $hi, $message) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return ok(
		$node->poll_query_until('postgres',
			"SELECT count(*) FROM dwarf.flow WHERE id BETWEEN $lo AND $hi AND status = 'running'",
			'0'),
		$message);
}

sub run_checks
{
	my ($mode) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $node = new_node("step_rows_$mode",
		'dwarf.workers' => 1,
		'wal_keep_size' => "'512MB'");
	my ($b1, $b2);
	$node->safe_psql('postgres', 'CREATE EXTENSION dwarf');
	if ($mode eq 'partitioned')
	{
		my $last = $node->safe_psql('postgres', 'SELECT last_value FROM dwarf.flow_seq');
		($b1, $b2) = ($last + 10, $last + 50);
		$node->safe_psql('postgres', partition_sql($b1, $b2));
		is( $node->safe_psql('postgres',
				"SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_partition_tree('dwarf.step_log') t
				   JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf"),
			'step_low step_mid step_rest', "$mode: dwarf.step_log is the table made by hand");
	}
	$node->safe_psql('postgres', $SETUP);
	wait_for_workers($node, "$mode: one dwarf worker runs", count => 1);

	# ------------------------------------------------------------ (a)
	my ($lo, $hi) = create_flows($node, 'look', 20, "jsonb_build_object('i', i)");
	flows_closed($node, $lo, $hi, "$mode (a): the 20 flows reading their own history closed");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE status = 'completed' AND (state->>'n')::int = 5)
			   FROM dwarf.flow WHERE id BETWEEN $lo AND $hi"),
		'20', "$mode (a): every flow completed its 5 steps");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step
			  WHERE flow_id BETWEEN $lo AND $hi AND task = 'look'
			    AND changes = '{\"n\": 1, \"history\": 2, \"step\": 2}'"),
		'20', "$mode (a): the middle task of each flow saw exactly its 2 earlier steps, in dwarf.history and in dwarf.step")
	  or diag $node->safe_psql('postgres',
		"SELECT flow_id, changes FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND task = 'look'");
	is( $node->safe_psql('postgres',
			"SELECT count(*) || ' ' || count(DISTINCT step_id) || ' ' || count(DISTINCT (flow_id, task))
			   FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND status = 'completed'"),
		'100 100 100', "$mode (a): 100 step rows, one per task of each flow");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND status <> 'completed'"),
		'0', "$mode (a): no other step row");

	# ------------------------------------------------------------ (b)
	($lo, $hi) = create_flows($node, 'fail', 40,
		"jsonb_build_object('i', i, 'bad', i = 20)");
	flows_closed($node, $lo, $hi, "$mode (b): the 40 flows, one failing, closed");
	my $bad = $lo + 19;
	is( $node->safe_psql('postgres',
			"SELECT string_agg(status || ':' || n, ' ' ORDER BY status)
			   FROM (SELECT status, count(*) n FROM dwarf.flow WHERE id BETWEEN $lo AND $hi
			          GROUP BY status) s"),
		'completed:39 failed:1', "$mode (b): 39 flows completed, one failed");
	is( $node->safe_psql('postgres', "SELECT status FROM dwarf.flow WHERE id = $bad"),
		'failed', "$mode (b): the failing flow is the one whose input said so");
	is( $node->safe_psql('postgres',
			"SELECT string_agg(task || ':' || status || ':' || n, ' ' ORDER BY task, status)
			   FROM (SELECT task, status, count(*) n FROM dwarf.step
			          WHERE flow_id BETWEEN $lo AND $hi AND flow_id <> $bad
			          GROUP BY task, status) s"),
		'f1:completed:39 f2:completed:39 f3:completed:39',
		"$mode (b): the 39 completed flows have each step row once");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND flow_id <> $bad
			    AND task = 'f2' AND changes = '{\"n\": 1, \"history\": 1}'"),
		'39', "$mode (b): each completed flow's f2 saw its one earlier step");
	is( $node->safe_psql('postgres',
			"SELECT string_agg(task || ':' || status, ' ' ORDER BY step_id)
			   FROM dwarf.step WHERE flow_id = $bad"),
		'f1:completed f2:failed', "$mode (b): the failed flow has f1 completed and f2 failed, nothing more");
	is( $node->safe_psql('postgres',
			"SELECT count(*) - count(DISTINCT step_id) FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi"),
		'0', "$mode (b): no step row twice");

	# ------------------------------------------------------------ (c)
	($lo, $hi) = create_flows($node, 'exc', 20, "jsonb_build_object('i', i)");
	flows_closed($node, $lo, $hi, "$mode (c): the 20 flows with a rolled-back block closed");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE status = 'completed' AND (state->>'n')::int = 4)
			   FROM dwarf.flow WHERE id BETWEEN $lo AND $hi"),
		'20', "$mode (c): every flow completed its 4 steps");
	is( $node->safe_psql('postgres',
			"SELECT count(*) || ' ' || count(DISTINCT (flow_id, task))
			   FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND status = 'completed'"),
		'80 80', "$mode (c): 80 step rows, one per task of each flow: none lost with the block");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND task = 'e2'
			    AND changes = '{\"n\": 1, \"after\": 1, \"inside\": 1}'"),
		'20', "$mode (c): each e2 saw its one earlier step inside the block and after it")
	  or diag $node->safe_psql('postgres',
		"SELECT flow_id, changes FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND task = 'e2'");

	if ($mode eq 'partitioned')
	{
		is( $node->safe_psql('postgres',
				"SELECT string_agg(tableoid::regclass::text, ' ' ORDER BY tableoid::regclass::text)
				   FROM (SELECT DISTINCT tableoid FROM dwarf.step_log) p"),
			'dwarf.step_low dwarf.step_mid dwarf.step_rest',
			"$mode: the rows went to all three partitions");
		is( $node->safe_psql('postgres',
				"SELECT (SELECT max(flow_id) < $b1 FROM dwarf.step_low)
				    AND (SELECT min(flow_id) >= $b1 AND max(flow_id) < $b2 FROM dwarf.step_mid)
				    AND (SELECT min(flow_id) >= $b2 FROM dwarf.step_rest)"),
			't', "$mode: each partition holds its range of flow ids");
	}

	# ------------------------------------------------------------ (d)
	my $l0 = $node->safe_psql('postgres', 'SELECT pg_current_wal_lsn()');
	($lo, $hi) = create_flows($node, 'ten', 500, "jsonb_build_object('i', i)");
	flows_closed($node, $lo, $hi, "$mode (d): the burst of 500 ten-step flows closed");
	# the flows' commits are flushed (synchronous_commit): so is their WAL, which
	# pg_walinspect reads only up to the flush position
	my $l1 = $node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()');
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND status = 'completed'"),
		'5000', "$mode (d): 5000 steps");
	my $packs = $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step_log WHERE flow_id BETWEEN $lo AND $hi");
	note "$mode (d): the 5000 steps are $packs rows of dwarf.step_log";
	cmp_ok($packs, '<=', 2500, "$mode (d): the steps are packed, two or more to a row on average");
	# (a MULTI_INSERT's description says "N tuples" on 15, "ntuples: N," since 16)
	my ($inserts, $multi, $multi_rows) = split /\|/, $node->safe_psql('postgres', qq{
		WITH r AS (
			SELECT resource_manager AS rm, split_part(record_type, '+', 1) AS rt, description,
			       (regexp_match(block_ref, 'rel \\d+/\\d+/(\\d+)'))[1]::oid AS fn
			  FROM pg_get_wal_records_info('$l0', '$l1'))
		SELECT count(*) FILTER (WHERE rm = 'Heap' AND rt = 'INSERT'),
		       count(*) FILTER (WHERE rm = 'Heap2' AND rt = 'MULTI_INSERT'),
		       coalesce(sum((regexp_match(description, '(?:ntuples: )?(\\d+)(?: tuples|,)'))[1]::int)
		                FILTER (WHERE rm = 'Heap2' AND rt = 'MULTI_INSERT'), 0)
		  FROM r
		 WHERE fn IN (SELECT pg_relation_filenode(relid) FROM pg_partition_tree('dwarf.step_log') WHERE isleaf)});
	note "$mode (d): dwarf.step_log WAL records: $inserts Heap/INSERT, $multi Heap2/MULTI_INSERT of $multi_rows rows";
	cmp_ok($multi, '>', 0, "$mode (d): dwarf.step_log's rows are written as Heap2/MULTI_INSERT records");
	cmp_ok($multi_rows, '>=', $packs, "$mode (d): the MULTI_INSERT records hold the burst's $packs rows");
	is($inserts, '0', "$mode (d): none as Heap/INSERT");

	# ------------------------------------------------------------ (e)
	($lo, $hi) = create_flows($node, 'tenslow', 300, "jsonb_build_object('i', i)");
	ok( $node->poll_query_until('postgres',
			"SELECT count(*) >= 500 FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi"),
		"$mode (e): the burst of 300 slow ten-step flows is under way");
	my $victim = $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'");
	my $running = $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id BETWEEN $lo AND $hi AND status = 'running'");
	my $log_offset = -s $node->logfile;
	ok($victim =~ /^\d+$/, "$mode (e): found the dwarf worker (pid $victim)");
	is(kill('KILL', $victim), 1, "$mode (e): sent it SIGKILL");
	cmp_ok($running, '>', 0, "$mode (e): flows were still running at the kill");
	$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
	wait_for_workers($node, "$mode (e): the worker runs again after the crash restart", count => 1);
	flows_closed($node, $lo, $hi, "$mode (e): every flow of the burst closed after the restart");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE status = 'completed' AND (state->>'n')::int = 10)
			   FROM dwarf.flow WHERE id BETWEEN $lo AND $hi"),
		'300', "$mode (e): all 300 flows completed with n = 10");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM (SELECT flow_id FROM dwarf.step
			                        WHERE flow_id BETWEEN $lo AND $hi AND status = 'completed'
			                        GROUP BY flow_id
			                       HAVING count(*) = 10 AND count(DISTINCT task) = 10) f"),
		'300', "$mode (e): every flow has exactly 10 completed step rows, one per task");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM dwarf.step WHERE flow_id BETWEEN $lo AND $hi AND status <> 'completed'"),
		'0', "$mode (e): no other step row");
	is( $node->safe_psql('postgres',
			"SELECT count(*) || ' ' || count(DISTINCT flow_id) FROM app.done
			  WHERE flow_id BETWEEN $lo AND $hi"),
		'3000 300', "$mode (e): each task's write is there once");

	stop_node($node, $t0);
}

run_checks('plain');
run_checks('partitioned');
done_testing();
