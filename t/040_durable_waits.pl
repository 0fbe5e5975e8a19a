# Copyright: dwarf project.
#
# 040_durable_waits.pl: flows that wait survive "pg_ctl stop -m immediate".
# Before the stop there are flows (a) sleeping in dwarf.sleep('3 s'), (b) in
# a retry backoff of 2 s, (c) interrupted, waiting for dwarf.resume, and (d)
# waiting for a subgraph child that sleeps.  After the restart the sleeping,
# retrying and waiting ones complete, none of them earlier than its wake time
# (checked with the steps' own timestamps), the interrupted ones stay
# interrupted until resumed and then complete with the resume data, and each
# task's SQL write happened exactly once.
#
# Then 2000 flows sleep at once: while they sleep the dwarf processes use
# (almost) no CPU, read from /proc/<pid>/stat, and then all of them complete.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $N     = 5;       # flows of each waiting kind
my $NIDLE = 2000;    # flows sleeping at once for the CPU check

my $t0   = time;
my $node = new_node('durable_waits');    # dwarf preloaded, 2 workers, restart_after_crash

# ---------------------------------------------------------------- setup
#
# Every task writes a row to done; the primary key makes a second execution
# of the same (flow, task, note) fail its step.
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE TABLE public.done (flow_id bigint, task text, note text NOT NULL DEFAULT '',
                          at timestamptz DEFAULT clock_timestamp(),
                          PRIMARY KEY (flow_id, task, note));
CREATE SCHEMA app;
CREATE FUNCTION app.mark(task text, note text DEFAULT '') RETURNS void LANGUAGE sql AS $$
	INSERT INTO public.done (flow_id, task, note) VALUES (dwarf.flow_id(), task, note)
$$;
CREATE FUNCTION app.after(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM app.mark('After');
	RETURN '{"after": true}';
END $$;

-- (a) sleep 3 s, then After
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep(coalesce(s->>'nap', '3 s')::interval);
	PERFORM app.mark('Nap');
	RETURN '{"napped": true}';
END $$;
SELECT dwarf.define('w_sleep', '{"tasks": {"Nap": "app.nap", "After": "app.after"},
  "transitions": [{"from": "Nap", "to": "After"}]}');

-- (b) fails twice with a 2 s backoff, then succeeds
CREATE FUNCTION app.flaky(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'tries')::int, 0) + 1;
BEGIN
	PERFORM app.mark('Flaky', n::text);
	IF n < 3 AND dwarf.retry('2 s', 1, '2 s') THEN
		RETURN jsonb_build_object('tries', n);
	END IF;
	RETURN jsonb_build_object('tries', n, 'ok', true);
END $$;
SELECT dwarf.define('w_retry', '{"tasks": {"Flaky": "app.flaky", "After": "app.after"},
  "transitions": [{"from": "Flaky", "to": "After"}]}');

-- (c) asks, parks; runs again on resume
CREATE FUNCTION app.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE d jsonb := dwarf.interrupt(jsonb_build_object('ask', s->'n'));
BEGIN
	IF d IS NULL THEN
		PERFORM app.mark('Ask', 'asked');
		RETURN NULL;
	END IF;
	PERFORM app.mark('Ask', 'answered');
	RETURN jsonb_build_object('answer', d);
END $$;
SELECT dwarf.define('w_ask', '{"tasks": {"Ask": "app.ask", "After": "app.after"},
  "transitions": [{"from": "Ask", "to": "After"}]}');

-- (d) a parent waiting for a child that sleeps 3 s
CREATE FUNCTION app.cnap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep('3 s');
	PERFORM app.mark('CNap');
	RETURN jsonb_build_object('child_napped', s->'n');
END $$;
CREATE FUNCTION app.cafter(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM app.mark('CAfter');
	RETURN '{"child_after": true}';
END $$;
SELECT dwarf.define('w_child', '{"tasks": {"CNap": "app.cnap", "CAfter": "app.cafter"},
  "transitions": [{"from": "CNap", "to": "CAfter"}]}');
CREATE FUNCTION app.call(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb := dwarf.subgraph('w_child', jsonb_build_object('n', s->'n'));
BEGIN
	IF r IS NULL THEN
		PERFORM app.mark('Call', 'started');
		RETURN NULL;
	END IF;
	PERFORM app.mark('Call', 'got');
	RETURN jsonb_build_object('child', r);
END $$;
SELECT dwarf.define('w_parent', '{"tasks": {"Call": "app.call", "After": "app.after"},
  "transitions": [{"from": "Call", "to": "After"}]}');
});

wait_for_workers($node, 'two dwarf workers run');

# ---------------------------------------------------------------- the waits

$node->safe_psql('postgres', "
	BEGIN;
	SELECT count(dwarf.create(g, jsonb_build_object('n', i)))
	  FROM unnest(ARRAY['w_sleep', 'w_retry', 'w_ask', 'w_parent']) g, generate_series(1, $N) i;
	COMMIT;");

# Everyone is waiting: the sleepers' first step is done, the retriers had
# their first attempt, the askers are interrupted, the children sleep.
my $kinds_q = q{
	SELECT g.name, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE (g.name = 'w_sleep' AND f.status = 'running'
	        AND EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.task = 'Nap')
	        AND NOT EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.task = 'After'))
	    OR (g.name = 'w_retry' AND f.status = 'running'
	        AND EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.status = 'retry')
	        AND NOT EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.status = 'completed'))
	    OR (g.name = 'w_ask' AND f.status = 'interrupted')
	    OR (g.name = 'w_parent' AND f.status = 'running'
	        AND EXISTS (SELECT 1 FROM dwarf.flow c WHERE c.parent_id = f.id AND c.status = 'running'
	                    AND EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = c.id AND s.task = 'CNap')
	                    AND NOT EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = c.id AND s.task = 'CAfter')))
	 GROUP BY 1 ORDER BY 1};
my $all_waiting = "w_ask|$N\nw_parent|$N\nw_retry|$N\nw_sleep|$N";
ok($node->poll_query_until('postgres', $kinds_q, $all_waiting),
	"$N flows of each kind are waiting (sleep, retry backoff, interrupt, subgraph)")
  or diag $node->safe_psql('postgres', $kinds_q);

$node->stop('immediate');

# ---------------------------------------------------------------- restart

start_after_immediate_stop($node, 'the server recovered from an immediate stop');
wait_for_workers($node, 'two dwarf workers run after the restart');

ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name <> 'w_ask' AND f.status <> 'completed'}, '0'),
	'after the restart the sleeping, retrying and waiting flows all complete')
  or diag $node->safe_psql('postgres',
	"SELECT g.name, f.status, f.error, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	  GROUP BY 1, 2, 3 ORDER BY 1, 2");

is( $node->safe_psql('postgres', q{
		SELECT g.name || ' ' || f.status || ' ' || count(*)
		  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 GROUP BY g.name, f.status ORDER BY 1}),
	join("\n", "w_ask interrupted $N", "w_child completed $N", "w_parent completed $N",
		"w_retry completed $N", "w_sleep completed $N"),
	'the interrupted flows are still interrupted, everything else completed');

# (a) no sleeper woke early: After started at least 3 s after Nap ended.
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Nap') a,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'After') b
		 WHERE g.name = 'w_sleep' AND b.started_at >= a.finished_at + '3 s'}),
	$N, 'every sleeper ran its next step no earlier than its wake time');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name = 'w_sleep' AND f.state = f.input || '{"napped": true, "after": true}'}),
	$N, 'every sleeper has the right final state');

# (b) the retries: attempts 1, 2 (retry) and 3 (completed), each at least 2 s apart.
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name = 'w_retry'
		   AND (SELECT string_agg(h.task || ':' || h.status || ':' || h.attempt, ' ' ORDER BY h.step_id)
		          FROM dwarf.history(f.id) h)
		       = 'Flaky:retry:1 Flaky:retry:2 Flaky:completed:3 After:completed:1'
		   AND f.state->'tries' = '3' AND f.state->'ok' = 'true'}),
	$N, 'every retrying flow has one history row per attempt and the right state');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Flaky') a,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Flaky') b
		 WHERE g.name = 'w_retry' AND b.attempt = a.attempt + 1
		   AND b.started_at >= a.finished_at + '2 s'}),
	2 * $N, 'no retry attempt started before its backoff was over');

# (d) the children slept, the parents got their final state.
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow c JOIN dwarf.graph g ON g.id = c.graph_id,
		       LATERAL (SELECT * FROM dwarf.history(c.id) WHERE task = 'CNap') a,
		       LATERAL (SELECT * FROM dwarf.history(c.id) WHERE task = 'CAfter') b
		 WHERE g.name = 'w_child' AND b.started_at >= a.finished_at + '3 s'}),
	$N, 'every child ran its next step no earlier than its wake time');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow p JOIN dwarf.graph g ON g.id = p.graph_id
		  JOIN dwarf.flow c ON c.parent_id = p.id
		 WHERE g.name = 'w_parent' AND c.state = c.input || '{"child_napped": 0, "child_after": true}'::jsonb
		       || jsonb_build_object('child_napped', p.input->'n')
		   AND p.state = p.input || jsonb_build_object('child', c.state, 'after', true)}),
	$N, "every parent's state holds its child's final state");

# (c) the interrupted flows: nothing ran for them after the restart; their
# payload is intact; resumed now, they complete with the resume data.
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name = 'w_ask' AND f.interrupt_payload = jsonb_build_object('ask', f.input->'n')
		   AND NOT EXISTS (SELECT 1 FROM public.done d WHERE d.flow_id = f.id AND d.note <> 'asked')}),
	$N, 'the interrupted flows kept their payload and ran nothing more');
$node->safe_psql('postgres', q{
	SELECT count(dwarf.resume(f.id, jsonb_build_object('ok', f.input->'n')))
	  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'w_ask'});
is( $node->safe_psql('postgres', q{
		SET statement_timeout = '90 s';
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
		       LATERAL dwarf.await(f.id, '60 s') o
		 WHERE g.name = 'w_ask' AND o.status = 'completed'
		   AND o.state = f.input || jsonb_build_object('answer', jsonb_build_object('ok', f.input->'n'),
		                                               'after', true)}),
	$N, 'resumed after the restart, the interrupted flows complete with the resume data');

# Exactly once: each task's write is there once per flow, nothing else.
is( $node->safe_psql('postgres', q{
		SELECT g.name || ' ' || d.task || ':' || d.note || ' ' || count(*)
		  FROM public.done d JOIN dwarf.flow f ON f.id = d.flow_id JOIN dwarf.graph g ON g.id = f.graph_id
		 GROUP BY g.name, d.task, d.note ORDER BY 1}),
	join("\n",
		"w_ask After: $N", "w_ask Ask:answered $N", "w_ask Ask:asked $N",
		"w_child CAfter: $N", "w_child CNap: $N",
		"w_parent After: $N", "w_parent Call:got $N", "w_parent Call:started $N",
		"w_retry After: $N", "w_retry Flaky:1 $N", "w_retry Flaky:2 $N", "w_retry Flaky:3 $N",
		"w_sleep After: $N", "w_sleep Nap: $N"),
	'each task wrote exactly once per flow (per attempt for the retries)');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE status = 'failed' OR error IS NOT NULL"),
	'0', 'no step failed (no duplicate write from a re-run task)')
  or diag $node->safe_psql('postgres',
	"SELECT flow_id, task, status, attempt, error->>'message' FROM dwarf.step
	  WHERE status = 'failed' OR error IS NOT NULL LIMIT 10");

# ---------------------------------------------------------------- 2000 sleepers, no CPU

$node->safe_psql('postgres', q{
	SELECT dwarf.define('w_idle', '{"tasks": {"Nap": "app.nap", "After": "app.after"},
	  "transitions": [{"from": "Nap", "to": "After"}]}')});
$node->safe_psql('postgres', "
	BEGIN;
	SELECT count(dwarf.create('w_idle', jsonb_build_object('n', i, 'nap', '12 s')))
	  FROM generate_series(1, $NIDLE) i;
	COMMIT;");
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
		  JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'w_idle' AND s.task = 'Nap'},
		$NIDLE),
	"$NIDLE flows are asleep");

my @pids = split /\n/, $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'dwarf%' ORDER BY pid");
cmp_ok(scalar @pids, '>=', 2, 'found the dwarf processes (' . scalar(@pids) . ')');

# utime + stime, in clock ticks, of the dwarf processes
sub dwarf_cpu_ticks
{
	my $sum = 0;
	foreach my $pid (@pids)
	{
		my $stat = slurp_file("/proc/$pid/stat");
		$stat =~ s/^.*\)\s+//s;    # past "pid (comm) "
		my @f = split /\s+/, $stat;
		$sum += $f[11] + $f[12];    # fields 14 (utime) and 15 (stime)
	}
	return $sum;
}
my $before = dwarf_cpu_ticks();
sleep(2);
my $after = dwarf_cpu_ticks();
# The window was inside the sleep: no After step had started by its end.
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
		  JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'w_idle' AND s.task = 'After'}),
	'0', 'the CPU window fell inside the sleep');
note "dwarf processes used " . ($after - $before) . " clock ticks in 2 s while $NIDLE flows slept";
cmp_ok($after - $before, '<', 20,
	"the dwarf processes use (almost) no CPU while $NIDLE flows sleep");

ok( $node->poll_query_until('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE g.name = 'w_idle' AND f.status = 'completed'}, $NIDLE),
	"all $NIDLE sleepers complete")
  or diag $node->safe_psql('postgres', "SELECT running, completed, failed, steps_done FROM dwarf.stats");
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Nap') a,
		       LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'After') b
		 WHERE g.name = 'w_idle' AND b.started_at >= a.finished_at + '12 s'}),
	$NIDLE, 'none of them woke early');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM public.done d JOIN dwarf.flow f ON f.id = d.flow_id
		  JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'w_idle'}),
	2 * $NIDLE, 'each of their tasks wrote once');

check_no_crash($node, 'no backend crashed');

stop_node($node, $t0);
done_testing();
