# Copyright: dwarf project.
#
# 186_stats.pl: dwarf's cumulative statistics (stats.c) count on when the
# flows they count are archived and purged, are readable by pg_monitor
# members, survive an orderly restart, and are zeroed by dwarf.stats_reset().
#
#  1. Graph "st" (A -> B; B raises when the input says so): 100 flows
#     complete and 10 fail.  dwarf.graph_stats shows 110 created, 100
#     completed, 10 failed, 220 steps run and 10 failed; dwarf.task_stats
#     shows A and B with 110 steps each; dwarf.stats_histogram() is
#     cumulative and its last bucket holds every duration.
#  2. dwarf.maintain() archives them all, dwarf.purge() deletes them: the
#     counters read the same.
#  3. Graph "park" parks a flow on dwarf.interrupt: dwarf.health shows its
#     age; then dwarf.cancel counts it cancelled.
#  4. A pg_monitor member reads exactly what the superuser reads; a role
#     without it cannot read the views, nor reset them.
#  5. pg_ctl restart: the counters read the same.
#  6. dwarf.stats_reset() zeroes them.
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
my $node = new_node('stats');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.ok(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"n": 1}'::jsonb $$;
CREATE FUNCTION app.maybe(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF (s->>'fail')::boolean THEN RAISE EXCEPTION 'asked to fail'; END IF;
	RETURN '{"n": 1}';
END $$;
CREATE FUNCTION app.park(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF dwarf.interrupt('{"why": "approval"}') IS NULL THEN RETURN NULL; END IF;
	RETURN '{}';
END $$;
SELECT dwarf.define('st', '{"tasks": {"A": "app.ok", "B": "app.maybe"},
  "transitions": [{"chain": ["A", "B", "END"]}], "reducers": {"n": "add"}}');
SELECT dwarf.define('park', '{"tasks": {"P": "app.park"}, "transitions": []}');
CREATE ROLE mon LOGIN IN ROLE pg_monitor;
CREATE ROLE nobody LOGIN;
});
wait_for_workers($node, 'the workers run');

# 1. 100 completed, 10 failed.
$node->safe_psql('postgres', q{
SELECT dwarf.create('st', jsonb_build_object('fail', i > 100)) FROM generate_series(1, 110) i});
ok($node->poll_query_until('postgres', q{
SELECT count(*) FILTER (WHERE status = 'completed') = 100 AND count(*) FILTER (WHERE status = 'failed') = 10
  FROM dwarf.flow}), '100 flows completed and 10 failed');

my $graph_q = q{
SELECT flows_created, flows_completed, flows_failed, flows_cancelled, steps_run, steps_failed,
       steps_retried, flow_seconds_count, step_seconds_count,
       flow_p50_s IS NOT NULL AND flow_p50_s <= flow_p95_s AND flow_p95_s <= flow_p99_s,
       step_p50_s IS NOT NULL AND step_p99_s >= step_p50_s, flow_seconds_sum > 0
  FROM dwarf.graph_stats WHERE graph = 'st'};
my $graph_want = '110|100|10|0|220|10|0|110|220|t|t|t';
ok($node->poll_query_until('postgres', $graph_q, $graph_want),
	'graph_stats: 110 created, 100 completed, 10 failed, 220 steps run, 10 failed');

my $task_q = q{
SELECT task, steps_run, steps_failed, steps_retried, step_seconds_count,
       step_p50_s IS NOT NULL, step_seconds_sum > 0
  FROM dwarf.task_stats WHERE graph = 'st' ORDER BY task};
my $task_want = "A|110|0|0|110|t|t\nB|110|10|0|110|t|t";
is($node->safe_psql('postgres', $task_q), $task_want, 'task_stats: A and B ran 110 steps each, 10 of B failed');

# Cumulative buckets, the last (+Inf) holding every duration, as _count says.
my $hist_q = q{
WITH h AS (SELECT graph, task, kind, le, count,
                  lag(count) OVER (PARTITION BY graph, task, kind ORDER BY le) AS before
             FROM dwarf.stats_histogram() WHERE graph = 'st')
SELECT kind, coalesce(task, '-'), count(*), bool_and(before IS NULL OR count >= before),
       max(count) FILTER (WHERE le = 'Infinity'), max(le) = 'Infinity'
  FROM h GROUP BY kind, task ORDER BY kind, task};
is($node->safe_psql('postgres', $hist_q), "flow|-|13|t|110|t\nstep|A|13|t|110|t\nstep|B|13|t|110|t",
	'stats_histogram: 13 cumulative buckets, the last (Infinity) holds every duration');

# 2. Archived, then purged: the counters do not go down.
$node->safe_psql('postgres', q{SET dwarf.archive_after = '0'; SELECT dwarf.maintain()});
is($node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.flow WHERE graph_id IN
  (SELECT id FROM dwarf.graph WHERE name = 'st')}), '0', 'dwarf.maintain archived every flow');
$node->safe_psql('postgres', q{SELECT dwarf.purge('0')});
is($node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.flow_all}), '0',
	'dwarf.purge deleted every flow, live or archived');
is($node->safe_psql('postgres', $graph_q), $graph_want, 'graph_stats reads the same after archive and purge');
is($node->safe_psql('postgres', $task_q), $task_want, 'task_stats reads the same after archive and purge');

# 3. An interrupted flow: its age in dwarf.health, then its cancel counted.
my $parked = $node->safe_psql('postgres', q{SELECT dwarf.create('park', '{}')});
ok($node->poll_query_until('postgres', qq{SELECT status = 'interrupted' FROM dwarf.flow WHERE id = $parked}),
	'the park flow is interrupted');
is($node->safe_psql('postgres', q{
SELECT graph, oldest_running_s IS NULL, oldest_interrupted_s >= 0, ready_backlog >= 0,
       timers_due >= 0, runners_busy >= 0, runners_max > 0, poison_steps, last_maintain IS NOT NULL
  FROM dwarf.health ORDER BY graph NULLS LAST}),
	"park|t|t|t|t|t|t|0|t\n|t|t|t|t|t|t|0|t",
	'dwarf.health: the interrupted flow\'s age, per graph and for the database');
$node->safe_psql('postgres', qq{SELECT dwarf.cancel($parked, 'no approval')});
ok($node->poll_query_until('postgres', q{
SELECT flows_created, flows_cancelled, flow_seconds_count, steps_run FROM dwarf.graph_stats WHERE graph = 'park'},
	'1|1|1|1'), 'graph_stats counts the cancel done by SQL');
is($node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.health WHERE graph IS NULL AND oldest_interrupted_s IS NULL}),
	'1', 'dwarf.health has a database row even with no open flow');

# 4. A pg_monitor member reads the same; a role without it reads nothing.
my $all_q = "$graph_q;\n$task_q;\n$hist_q;\nSELECT count(*) FROM dwarf.health";
my $as_super = $node->safe_psql('postgres', $all_q);
is($node->safe_psql('postgres', $all_q, extra_params => [ '-U', 'mon' ]), $as_super,
	'a pg_monitor member reads the same counters, histograms and health');
my ($rc, $out, $err) = $node->psql('postgres', 'SELECT * FROM dwarf.graph_stats', extra_params => [ '-U', 'nobody' ]);
like($err, qr/permission denied/, 'a role outside pg_monitor may not read dwarf.graph_stats');
($rc, $out, $err) = $node->psql('postgres', 'SELECT dwarf.stats_reset()', extra_params => [ '-U', 'mon' ]);
like($err, qr/permission denied/, 'a pg_monitor member may not reset the counters');

# 5. An orderly restart keeps them.
$node->restart;
is($node->safe_psql('postgres', $graph_q), $graph_want, 'graph_stats reads the same after a restart');
is($node->safe_psql('postgres', $task_q), $task_want, 'task_stats reads the same after a restart');
is($node->safe_psql('postgres', $hist_q), "flow|-|13|t|110|t\nstep|A|13|t|110|t\nstep|B|13|t|110|t",
	'stats_histogram reads the same after a restart');

# 6. dwarf.stats_reset() zeroes them.
$node->safe_psql('postgres', q{SELECT dwarf.stats_reset()});
is($node->safe_psql('postgres', q{
SELECT flows_created, flows_completed, flows_failed, steps_run, flow_seconds_count, flow_p50_s IS NULL,
       stats_reset > now() - interval '1 hour'
  FROM dwarf.graph_stats WHERE graph = 'st'}), '0|0|0|0|0|t|t', 'dwarf.stats_reset() zeroes the counters');
is($node->safe_psql('postgres', q{SELECT sum(count) FROM dwarf.stats_histogram()}), '0',
	'dwarf.stats_reset() empties the histograms');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
