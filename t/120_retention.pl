# Copyright: dwarf project.
#
# 120_retention.pl: dwarf.maintain() moving closed flows into the archive,
# scheduled by pg_cron, and racing everything else that touches flows.
#
# One server preloads dwarf and pg_cron (cron.use_background_workers: the
# job runs in a background worker, no TCP connection or password), with
# dwarf.segment_interval = '1 s', so that a few hundred flows fill a
# segment of the step log and passes hand segments to the archive.
#
#  1. pg_cron, in database "postgres" (cron.database_name): flows of a
#     3-step chain (and one that fails) close; their dwarf.await,
#     dwarf.snapshot, dwarf.history, dwarf.step, dwarf.history_mermaid and
#     dwarf.list are recorded while they are live; then the README's line
#     schedules dwarf.maintain() every minute, with dwarf.archive_after = 0
#     set by ALTER DATABASE.  The job (pg_cron's minute granularity: up
#     to a minute's wait) moves every flow into the archive, and every
#     step: the flows ran before any pass, so their steps are in
#     dwarf.step_default, and the first pass moves them into the archived
#     segment it makes for the ids before it.  The job's runs succeed,
#     dwarf.maintain_log and dwarf.storage show the pass,
#     every read answers exactly as before the move, and a fork and a
#     continue of an archived flow complete.
#  2. Concurrency, in database "conc", while the cron job waits for its
#     minute: pgbench creates thousands of 3-step flows at full speed;
#     meanwhile two sessions call dwarf.maintain() in a loop (one with
#     "now" a day further ahead every three passes, so that it makes a new
#     day's partitions as the first pass after midnight does; its
#     dwarf.retention is 1000 days, so it drops nothing), and a third
#     deletes, forks (from step B) and continues closed flows, picked half
#     the time among the newest (the ones being moved) and half at random,
#     checking dwarf.await and dwarf.history of each first.  The passes
#     make segments ahead of the ids and hand the passed ones to the
#     archive while the workers write (maintain2's, a day ahead, also
#     those with flows still running, whose steps it moves to
#     dwarf.step_default).  Once the load is done and a last pass has run:
#     no session saw an error; the passes handed segments over during the
#     load; every created flow is in exactly one of dwarf.flow and
#     dwarf.flow_archive (none twice), except the deleted ones, which are
#     nowhere, steps included; no flow is left in dwarf.flow, and no step
#     in dwarf.step but those of the segment the next flow goes to (every
#     segment the ids have passed is archived, dwarf.step_default is
#     empty); every step row is in the segment that covers its flow id
#     and has its flow (none orphaned); every flow completed with its steps,
#     once each, and the right final state; forks and continues completed,
#     and a continued flow names its thread, archived or not.  Then a
#     closed flow whose row another session holds (FOR UPDATE, in an open
#     transaction) stays while a pass moves another, and the next pass
#     after the row is let go moves it.
#
# Every wait polls with a deadline; nothing is timed.
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

my $LOAD_CLIENTS = 2;
my $LOAD_PER     = 2000;    # flows each pgbench client creates
my $NLOAD        = $LOAD_CLIENTS * $LOAD_PER;
my $MIN_OPS      = 20;      # at least this many deletes, forks and continues

my $t0   = time;
my $node = new_node('retention',
	shared_preload_libraries    => "'dwarf,pg_cron'",
	'cron.database_name'        => "'postgres'",
	'cron.use_background_workers' => 'on',
	'dwarf.segment_interval'    => "'1 s'",
	max_worker_processes        => 32);

# Graph "c3": A -> B -> C, each step adds 1 to n, so a flow ends with n = 3;
# a fork from B starts from n = 1 and ends with 3; a continue starts from
# the closed flow's n = 3 and ends with 6.  Graph "fails": A, then B raises.
my $graphs = q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.step(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"n": 1}'::jsonb $$;
CREATE FUNCTION app.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'boom at n = %', s->>'n'; END $$;
SELECT dwarf.define('c3', '{"tasks": {"A": "app.step", "B": "app.step", "C": "app.step"},
  "transitions": [{"chain": ["A", "B", "C", "END"]}], "reducers": {"n": "add"}}');
SELECT dwarf.define('fails', '{"tasks": {"A": "app.step", "B": "app.boom"},
  "transitions": [{"chain": ["A", "B", "END"]}], "reducers": {"n": "add"}}');
};

$node->safe_psql('postgres', "CREATE EXTENSION pg_cron;\n" . $graphs);
$node->safe_psql('postgres', q{CREATE DATABASE conc});
$node->safe_psql('conc', $graphs);
$node->safe_psql('postgres', q{ALTER DATABASE postgres SET dwarf.archive_after = '0'});
$node->safe_psql('postgres', q{ALTER DATABASE conc SET dwarf.archive_after = '0'});
wait_for_workers($node, 'two dwarf workers run in each database', count => 4);

# ---------------------------------------------------------------- 1. flows for pg_cron
#
# Everything a read of a closed flow answers, one line per flow.
my $reads = q{
SELECT string_agg(concat_ws(' | ', f.id,
         (SELECT a::text FROM dwarf.await(f.id, '5 s') a),
         (SELECT s::text FROM dwarf.snapshot(f.id) s),
         (SELECT jsonb_agg(h ORDER BY h.step_id)::text FROM dwarf.history(f.id) h),
         (SELECT jsonb_agg(h ORDER BY h.step_id)::text FROM (SELECT * FROM dwarf.history(f.id) WHERE task = 'B') h),
         dwarf.history_mermaid(f.id)), E'\n' ORDER BY f.id)
    || E'\n' || (SELECT string_agg(l::text, E'\n') FROM dwarf.list() l)
  FROM dwarf.flow_all f
};
my $NCRON = 20;
is( $node->safe_psql('postgres', qq{
SET statement_timeout = '90 s';
SELECT string_agg(r.status || ' ' || (r.state->>'n'), ',')
  FROM generate_series(1, $NCRON) i,
       LATERAL dwarf.run('c3', jsonb_build_object('i', i), timeout => '60 s') r;
SELECT status || ' ' || error FROM dwarf.run('fails', '{}', timeout => '60 s');}),
	join(',', ('completed 3') x $NCRON) . "\nfailed boom at n = 1",
	"$NCRON flows of c3 completed and one of fails failed");
is( $node->safe_psql('postgres',
		q{SELECT (SELECT count(*) FROM dwarf.flow) || ' ' || (SELECT count(*) FROM dwarf.step)
		      || ' ' || (SELECT count(*) FROM dwarf.flow_archive)}),
	($NCRON + 1) . ' ' . (3 * $NCRON + 2) . ' 0',
	'before the job, every flow and step is live and the archive is empty');
my $reads_live = $node->safe_psql('postgres', $reads);

is( $node->safe_psql('postgres',
		q{SELECT cron.schedule('dwarf-maintain', '* * * * *', 'SELECT dwarf.maintain()') > 0}),
	't', 'cron.schedule takes the line the README shows');
# pg_cron's scheduler marks its list of jobs up to date when it has read
# it, after the read: a job whose invalidation it took in the middle of
# that read (here, the first job, scheduled just after CREATE EXTENSION
# pg_cron, while the scheduler reads its list for the first time) stays
# unknown to it until the next change of cron.job or a reload.  It once
# ran no job for five minutes here.  A reload makes it read the list again.
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

# ---------------------------------------------------------------- 2. concurrency
#
# created: every flow made in "conc", by whom (load, fork, continue), from
# which flow, and what the ops session did with it (used).
$node->safe_psql('conc', q{
CREATE TABLE created (id bigint PRIMARY KEY, kind text NOT NULL, src bigint, used text);
CREATE TABLE ctl (stop boolean NOT NULL);
INSERT INTO ctl VALUES (false);

-- passes: each loop's passes, the flows they moved and the segments they
-- handed to the archive, counted in the pass's own transaction.
CREATE TABLE passes (session text PRIMARY KEY, n int NOT NULL DEFAULT 0, moved bigint NOT NULL DEFAULT 0,
                     archived int NOT NULL DEFAULT 0);
INSERT INTO passes (session) VALUES ('maintain1'), ('maintain2');
CREATE PROCEDURE maintain_loop(session text, ahead boolean)
LANGUAGE plpgsql AS $$
DECLARE
	r jsonb;
	i int := 0;
BEGIN
	IF ahead THEN
		PERFORM set_config('dwarf.retention', '1000 days', false);
	END IF;
	LOOP
		r := dwarf_internal.maintain_at(now() + CASE WHEN ahead THEN make_interval(days => least(i / 3, 60))
		                                 ELSE '0' END);
		UPDATE passes p SET n = p.n + 1, moved = p.moved + (r->>'moved_flows')::bigint,
		       archived = p.archived + jsonb_array_length(r->'segments_archived')
		 WHERE p.session = maintain_loop.session;
		i := i + 1;
		COMMIT;
		EXIT WHEN i >= 3 AND (SELECT stop FROM ctl);
	END LOOP;
END $$;

CREATE PROCEDURE ops_loop(min_ops int)
LANGUAGE plpgsql AS $$
DECLARE
	deletes int := 0;
	forks int := 0;
	continues int := 0;
	i int := 0;
	fid bigint;
	sid bigint;
	nid bigint;
	st text;
	nsteps bigint;
BEGIN
	LOOP
		EXIT WHEN least(deletes, forks, continues) >= min_ops AND (SELECT stop FROM ctl);
		i := i + 1;
		IF i % 2 = 0 THEN
			SELECT c.id INTO fid FROM created c
			 WHERE c.kind = 'load' AND c.used IS NULL
			   AND EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id = c.id AND f.status = 'completed')
			 ORDER BY c.id DESC LIMIT 1;
		ELSE
			SELECT c.id INTO fid FROM created c
			 WHERE c.kind = 'load' AND c.used IS NULL
			   AND EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id = c.id AND f.status = 'completed')
			 ORDER BY random() LIMIT 1;
		END IF;
		IF fid IS NULL THEN
			PERFORM pg_sleep(0.01);
			COMMIT;
			CONTINUE;
		END IF;

		st := (dwarf.await(fid, '5 s')).status;
		IF st IS DISTINCT FROM 'completed' THEN
			RAISE EXCEPTION 'dwarf.await(%) says %', fid, st;
		END IF;
		SELECT count(*) INTO nsteps FROM dwarf.history(fid);
		IF nsteps <> 3 THEN
			-- where the flow's rows are: through the parents (pruned to the
			-- partition that covers the id) and in the default partition
			-- read directly, where a row routed by a stale descriptor would be
			RAISE EXCEPTION 'dwarf.history(%) has % steps', fid, nsteps
			  USING DETAIL = format('rows: %s; the segment of the id: %s', (
				SELECT string_agg(format('%s %s', x.part, x.n), ', ') FROM (
				  SELECT l.tableoid::regclass::text AS part, count(*) AS n
				    FROM dwarf.step_log l WHERE l.flow_id = fid GROUP BY 1
				  UNION ALL
				  SELECT a.tableoid::regclass::text, count(*)
				    FROM dwarf.step_log_archive a WHERE a.flow_id = fid GROUP BY 1
				  UNION ALL
				  SELECT 'dwarf.step_default read directly', count(*)
				    FROM dwarf.step_default d WHERE d.flow_id = fid) x),
				(SELECT format('%s (live %s)', g.relation, g.live)
				   FROM dwarf.segment g WHERE fid >= g.lo AND fid < g.hi));
		END IF;

		CASE i % 3
		WHEN 0 THEN
			PERFORM dwarf.delete(fid);
			UPDATE created SET used = 'delete' WHERE id = fid;
			deletes := deletes + 1;
		WHEN 1 THEN
			SELECT h.step_id INTO sid FROM dwarf.history(fid) h WHERE h.task = 'B';
			IF sid IS NULL THEN
				RAISE EXCEPTION 'dwarf.history(%) has no step of B', fid;
			END IF;
			nid := dwarf.fork(sid, '{"forked": true}');
			INSERT INTO created VALUES (nid, 'fork', fid);
			UPDATE created SET used = 'fork' WHERE id = fid;
			forks := forks + 1;
		ELSE
			nid := dwarf.continue(fid, '{"continued": true}');
			INSERT INTO created VALUES (nid, 'continue', fid);
			UPDATE created SET used = 'continue' WHERE id = fid;
			continues := continues + 1;
		END CASE;
		COMMIT;
	END LOOP;
END $$;
});

my $pgbench_script = PostgreSQL::Test::Utils::tempdir() . '/create.sql';
PostgreSQL::Test::Utils::append_to_file($pgbench_script,
	"INSERT INTO created (id, kind) SELECT dwarf.create('c3', '{}'), 'load';\n");

# start_session(@command): runs a client in the background; returns its
# harness and references to its stdout and stderr.
sub start_session
{
	my @cmd = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(\@cmd, '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return { h => $h, out => \$out, err => \$err };
}

# finish_session($s): waits for the client to exit; its exit code, or
# "timeout".
sub finish_session
{
	my ($s) = @_;
	my $ok = eval { $s->{h}->finish; 1 };
	if (!$ok)
	{
		$s->{h}->kill_kill;
		return "timeout: $@";
	}
	return $s->{h}->result(0);
}

my @psql = ($node->installed_command('psql'), '-XAtq', '-v', 'ON_ERROR_STOP=1',
	'-d', $node->connstr('conc'));
my %s;
$s{maintain1} = start_session(@psql, '-c', "CALL maintain_loop('maintain1', false)");
$s{maintain2} = start_session(@psql, '-c', "CALL maintain_loop('maintain2', true)");
$s{ops}       = start_session(@psql, '-c', "CALL ops_loop($MIN_OPS)");
$s{load} = start_session($node->installed_command('pgbench'), '-n', '-c', $LOAD_CLIENTS,
	'-j', $LOAD_CLIENTS, '-t', $LOAD_PER, '-f', $pgbench_script,
	'-h', $node->host, '-p', $node->port, 'conc');

my $load_rc = finish_session($s{load});
is($load_rc, 0, "pgbench created $NLOAD flows without an error")
  or diag ${ $s{load}{err} };
is($node->safe_psql('conc', q{SELECT count(*) FROM created WHERE kind = 'load'}),
	$NLOAD, "$NLOAD load flows recorded");

# Let the loops run on until the load has closed, then tell them to stop.
ok( $node->poll_query_until('conc',
		q{SELECT count(*) FROM dwarf.flow_all f JOIN created c ON c.id = f.id
		   WHERE c.kind = 'load' AND f.status = 'running'}, '0'),
	'every load flow closed');
$node->safe_psql('conc', 'UPDATE ctl SET stop = true');
for my $name (qw(maintain1 maintain2 ops))
{
	my $rc = finish_session($s{$name});
	is($rc, 0, "the $name session ended without an error")
	  or diag "$name: stdout: ${ $s{$name}{out} }\nstderr: ${ $s{$name}{err} }";
	is(${ $s{$name}{err} }, '', "the $name session wrote nothing to stderr");
}
note $node->safe_psql('conc',
	q{SELECT string_agg(format('%s: %s passes moved %s flows, archived %s segments', session, n, moved, archived),
	                    ', ') FROM passes});
is($node->safe_psql('conc', q{SELECT bool_and(n > 0) AND sum(moved) > 0 AND sum(archived) > 0 FROM passes}),
	't', 'both maintain loops ran passes, which moved flows and archived segments while the load ran');
my ($deletes, $forks, $continues) = split /\|/, $node->safe_psql('conc', q{
SELECT count(*) FILTER (WHERE used = 'delete') || '|' || count(*) FILTER (WHERE used = 'fork')
       || '|' || count(*) FILTER (WHERE used = 'continue') FROM created});
note "ops: $deletes deletes, $forks forks, $continues continues";
ok($deletes >= $MIN_OPS && $forks >= $MIN_OPS && $continues >= $MIN_OPS,
	"the ops session deleted, forked and continued at least $MIN_OPS flows each");

# Forks and continues made after the load finish too; then one last pass.
ok( $node->poll_query_until('conc',
		q{SELECT count(*) FROM dwarf.flow WHERE status IN ('running', 'interrupted')}, '0'),
	'every flow closed');
my $last = $node->safe_psql('conc', q{SELECT dwarf.maintain()});
note "last pass: $last";

is( $node->safe_psql('conc', q{
SELECT (SELECT count(*) FROM dwarf.flow) || ' ' || (SELECT count(*) FROM dwarf.step_default) || ' '
       || (SELECT count(*) FROM dwarf.segment WHERE live AND hi <= dwarf_internal.next_flow_id()) || ' '
       || (SELECT count(*) FROM dwarf.step s
            WHERE NOT EXISTS (SELECT 1 FROM dwarf.segment g
                               WHERE g.live AND g.lo <= dwarf_internal.next_flow_id()
                                 AND dwarf_internal.next_flow_id() < g.hi
                                 AND s.flow_id >= g.lo AND s.flow_id < g.hi))}),
	'0 0 0 0', 'after the last pass, no flow is left in the live tables, every segment passed is archived, '
	  . 'and the only live steps are in the segment the next flow goes to');
is( $node->safe_psql('conc',
		q{SELECT count(*) FROM (SELECT id FROM dwarf.flow_all GROUP BY id HAVING count(*) > 1) d}),
	'0', 'no flow is twice in dwarf.flow and dwarf.flow_archive');
is( $node->safe_psql('conc', q{
SELECT count(*) FROM created c
 WHERE (c.used IS DISTINCT FROM 'delete') <> EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id = c.id)}),
	'0', 'every created flow is archived or live, except the deleted ones, which are gone')
  or diag $node->safe_psql('conc', q{
SELECT c.* FROM created c
 WHERE (c.used IS DISTINCT FROM 'delete') <> EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id = c.id)
 LIMIT 10});
is( $node->safe_psql('conc',
		q{SELECT count(*) FROM dwarf.flow_all f WHERE NOT EXISTS (SELECT 1 FROM created c WHERE c.id = f.id)}),
	'0', 'no flow exists that nobody created');
is( $node->safe_psql('conc', q{
SELECT count(*) FROM dwarf.step_all s JOIN created c ON c.id = s.flow_id WHERE c.used = 'delete'}),
	'0', 'no step of a deleted flow is left');
is( $node->safe_psql('conc', q{
SELECT (SELECT count(*) FROM dwarf.step_all s
         WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id = s.flow_id))
    || ' ' ||
       (SELECT count(*)
          FROM (SELECT tableoid, flow_id, true AS live FROM dwarf.step_log
                UNION ALL SELECT tableoid, flow_id, false FROM dwarf.step_log_archive) s
         WHERE NOT EXISTS (SELECT 1 FROM dwarf.segment g
                            WHERE s.tableoid = ('dwarf.' || g.relation)::regclass AND g.live = s.live
                              AND s.flow_id >= g.lo AND s.flow_id < g.hi))}),
	'0 0', 'every step row has its flow, and sits in the segment that covers its flow id');

is( $node->safe_psql('conc',
		q{SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
		    FROM (SELECT status, count(*) n FROM dwarf.flow_all GROUP BY status) s}),
	'completed=' . $node->safe_psql('conc', q{SELECT count(*) FROM created WHERE used IS DISTINCT FROM 'delete'}),
	'every flow that is left completed');
is( $node->safe_psql('conc', q{
SELECT count(*) FROM created c JOIN dwarf.flow_all f ON f.id = c.id
 WHERE (SELECT count(*) FROM dwarf.step_all s WHERE s.flow_id = c.id AND s.status = 'completed')
       <> CASE c.kind WHEN 'fork' THEN 2 ELSE 3 END
    OR (SELECT count(*) FROM dwarf.step_all s WHERE s.flow_id = c.id AND s.status <> 'completed') <> 0}),
	'0', 'every flow has its steps, once each: 3 (2 for a fork from B)');
is( $node->safe_psql('conc', q{
SELECT count(*) FROM created c JOIN dwarf.flow_all f ON f.id = c.id
 WHERE f.state IS DISTINCT FROM CASE c.kind
         WHEN 'load' THEN '{"n": 3}'
         WHEN 'fork' THEN '{"n": 3, "forked": true}'
         ELSE '{"n": 6, "continued": true}' END::jsonb}),
	'0', 'every final state is right (load n = 3, fork n = 3, continue n = 6)')
  or diag $node->safe_psql('conc', q{
SELECT c.kind, f.id, f.state FROM created c JOIN dwarf.flow_all f ON f.id = c.id
 WHERE f.state IS DISTINCT FROM CASE c.kind WHEN 'load' THEN '{"n": 3}'
         WHEN 'fork' THEN '{"n": 3, "forked": true}' ELSE '{"n": 6, "continued": true}' END::jsonb
 LIMIT 10});
is( $node->safe_psql('conc', q{
SELECT kind || '=' || count(*) FROM created c JOIN dwarf.flow_all f ON f.id = c.id
 WHERE c.kind IN ('fork', 'continue') AND f.status = 'completed' GROUP BY kind ORDER BY kind}),
	"continue=$continues\nfork=$forks",
	'every fork and every continue made a flow that completed');
is( $node->safe_psql('conc', q{
SELECT count(*) FROM created c JOIN dwarf.flow_all src ON src.id = c.src
  JOIN dwarf.flow_all f ON f.id = c.id
 WHERE c.kind = 'continue' AND (src.thread IS DISTINCT FROM c.src::text OR f.thread IS DISTINCT FROM c.src::text)}),
	'0', 'every continued flow and its continuation name the same thread, archived or not');
is( $node->safe_psql('conc', q{
SELECT count(*) = least(1000, (SELECT sum(n) FROM passes) + 1) FROM dwarf.maintain_log}),
	't',
	'dwarf.maintain_log has one row per pass (it keeps the last 1000)');

# A closed flow whose row another session holds is left to a later pass: the
# pass waits for the row half a second at most, then moves the others.
my @closed = map {
	$node->safe_psql('conc', q{SELECT flow_id FROM dwarf.run('c3', '{}', timeout => '60 s') WHERE status = 'completed'})
} (1, 2);
my $row_holder = $node->background_psql('conc');
$row_holder->query_safe("BEGIN; SELECT id FROM dwarf.flow WHERE id = $closed[0] FOR UPDATE");
my $held_pass = $node->safe_psql('conc', q{SET dwarf.archive_after = 0; SELECT dwarf.maintain()});
is( $node->safe_psql('conc', qq{
SELECT (SELECT string_agg(id::text, ',') FROM dwarf.flow WHERE id IN ($closed[0], $closed[1])) || ' '
       || (SELECT string_agg(tableoid::regclass::text || ':' || id, ',') FROM dwarf.flow_archive
            WHERE id IN ($closed[0], $closed[1]))}),
	"$closed[0] dwarf.flow_archive_" . $node->safe_psql('conc', q{SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')})
	  . ":$closed[1]",
	'a pass moves a closed flow into the archive\'s day but not one whose row another session holds')
  or diag $held_pass;
$row_holder->query_safe('COMMIT');
$row_holder->quit;
$node->safe_psql('conc', q{SET dwarf.archive_after = 0; SELECT dwarf.maintain()});
is( $node->safe_psql('conc', qq{SELECT count(*) FROM dwarf.flow_archive WHERE id IN ($closed[0], $closed[1])}),
	'2', 'once the row is let go, the next pass moves it');
is( $node->safe_psql('conc', qq{SELECT string_agg(task, '' ORDER BY step_id) FROM dwarf.history($closed[0])}),
	'ABC', 'with its history whole');

# ---------------------------------------------------------------- 1. pg_cron, the outcome
ok( $node->poll_query_until('postgres',
		qq{SELECT (SELECT count(*) FROM dwarf.flow) = 0 AND (SELECT count(*) FROM dwarf.step) = 0
		      AND (SELECT count(*) FROM dwarf.flow_archive) = $NCRON + 1}),
	'the pg_cron job moved every flow into the archive');
is( $node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.step_archive}),
	3 * $NCRON + 2, 'and every step');
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM cron.job_run_details d JOIN cron.job j ON j.jobid = d.jobid
		   WHERE j.jobname = 'dwarf-maintain' AND d.status = 'succeeded'}),
	'cron.job_run_details shows a run of the job that succeeded');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM cron.job_run_details WHERE status NOT IN ('succeeded', 'starting', 'running')}),
	'0', 'and none that failed')
  or diag $node->safe_psql('postgres', q{SELECT * FROM cron.job_run_details});
is( $node->safe_psql('postgres', q{
SELECT sum((result->>'moved_flows')::int) || ' ' || sum((result->>'moved_steps')::int) FROM dwarf.maintain_log}),
	($NCRON + 1) . ' ' . (3 * $NCRON + 2), 'dwarf.maintain_log shows the job\'s passes and what they moved');
is( $node->safe_psql('postgres', q{
SELECT oldest_archived_day IS NOT NULL AND last_maintain_at IS NOT NULL AND archive_step_bytes > 0
  FROM dwarf.storage}),
	't', 'dwarf.storage shows the archive and the last pass');
my $reads_archived = $node->safe_psql('postgres', $reads);
is($reads_archived, $reads_live,
	'await, snapshot, history, step, history_mermaid and list answer the same after the move');
like($reads_archived, qr/"boom at n = 1"/, 'the failed flow\'s error is in its history');

# A fork of an archived step and a continue of an archived flow run.
my $fork_id = $node->safe_psql('postgres', q{
SELECT dwarf.fork(s.step_id, '{"forked": true}')
  FROM dwarf.step_archive s JOIN dwarf.flow_archive f ON f.id = s.flow_id
  JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'c3' AND s.task = 'B' ORDER BY f.id LIMIT 1});
my $continue_id = $node->safe_psql('postgres', q{
SELECT dwarf.continue(f.id, '{"continued": true}')
  FROM dwarf.flow_archive f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'c3' ORDER BY f.id LIMIT 1});
is( $node->safe_psql('postgres', qq{
SET statement_timeout = '90 s';
SELECT status || ' ' || state::text FROM dwarf.await($fork_id, '60 s');
SELECT status || ' ' || state::text FROM dwarf.await($continue_id, '60 s');}),
	qq{completed {"i": 1, "n": 3, "forked": true}\ncompleted {"i": 1, "n": 6, "continued": true}},
	'a fork from an archived step and a continue of an archived flow complete');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
