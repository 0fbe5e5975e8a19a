# Copyright: dwarf project.
#
# 050_shared_workers.pl: what one flow's steps can do to the others that share
# dwarf's workers.
#
#  1. Time: a task that once ran long is slow; eight flows of it created at
#     once run in runners side by side (their steps overlap), and a quick
#     2-step dwarf.run started meanwhile completes before any of them ends.
#     (The figures, in milliseconds, are measured by bench/slow-steps.sh.)
#  2. Locks: 4000 flows of 4 one-row UPDATEs over 10 hot rows deadlock each
#     other's batches; the steps that met the conflict run again alone, so
#     every flow completes and the sum is exact.
#  3. Cancel: a flow whose three branches were claimed in one batch, cancelled
#     while one of them runs (in a worker, or in a runner once preempted),
#     has it stopped, its write rolled back, and starts none of the others.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0   = time;
my $node = new_node('shared_workers', max_worker_processes => 32,
	deadlock_timeout => "'100ms'");

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.slow(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT pg_sleep(2); SELECT '{"slept": true}'::jsonb $$;
SELECT dwarf.define('slow', '{"tasks": {"S": "app.slow"}, "transitions": []}');
SELECT dwarf.define('quick', '{"tasks": {"A": "app.noop", "B": "app.noop"},
  "transitions": [{"from": "A", "to": "B"}]}');

CREATE TABLE hot (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO hot SELECT g, 0 FROM generate_series(0, 9) g;
CREATE FUNCTION app.bump(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	UPDATE hot SET n = n + 1 FROM (SELECT floor(random() * 10)::int AS id) r
	 WHERE hot.id = r.id;
	SELECT '{}'::jsonb $$;
SELECT dwarf.define('hot', '{"tasks": {"A": "app.bump", "B": "app.bump", "C": "app.bump",
  "D": "app.bump"}, "transitions": [{"chain": ["A", "B", "C", "D"]}]}');

CREATE TABLE started (flow_id bigint, task text);
GRANT INSERT ON started TO PUBLIC;
CREATE FUNCTION app.mark_and_wait(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	INSERT INTO started VALUES (dwarf.flow_id(), s->>'branch');
	SELECT pg_sleep(1.5); SELECT '{}'::jsonb $$;
CREATE FUNCTION app.b1(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT app.mark_and_wait('{"branch": "B1"}') $$;
CREATE FUNCTION app.b2(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT app.mark_and_wait('{"branch": "B2"}') $$;
CREATE FUNCTION app.b3(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT app.mark_and_wait('{"branch": "B3"}') $$;
SELECT dwarf.define('fan', '{"tasks": {"A": "app.noop", "B1": "app.b1", "B2": "app.b2",
  "B3": "app.b3", "J": "app.noop"}, "fan_in": ["J"],
  "transitions": [{"from": "A", "to": ["B1", "B2", "B3"]}, {"from": "B1", "to": "J"},
                  {"from": "B2", "to": "J"}, {"from": "B3", "to": "J"}]}');
});
wait_for_workers($node, 'two workers run');

# ---------------------------------------------------------------- 1. time
is($node->safe_psql('postgres', q{SELECT status FROM dwarf.run('slow', '{}', timeout => '30 s')}),
	'completed', 'the slow task ran once (it is now known to be slow)');

my $quick = $node->safe_psql('postgres', q{
SELECT count(*) FROM (SELECT dwarf.create('slow', '{}') FROM generate_series(1, 8)) c;
SELECT pg_sleep(0.2);
SELECT flow_id || ' ' || status FROM dwarf.run('quick', '{}', timeout => '30 s');
});
my ($quick_id, $quick_status) = split / /, (split /\n/, $quick)[-1];
is($quick_status, 'completed', 'a quick dwarf.run completes while eight slow steps run');
$node->poll_query_until('postgres', q{
SELECT count(*) = 9 FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'slow' AND f.status = 'completed'}) or diag('slow flows did not complete');
is($node->safe_psql('postgres', qq{
SELECT (SELECT finished_at FROM dwarf.flow WHERE id = $quick_id) <
       (SELECT min(s.finished_at) FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
         JOIN dwarf.graph g ON g.id = f.graph_id
        WHERE g.name = 'slow' AND f.id <> (SELECT min(id) FROM dwarf.flow WHERE graph_id = g.id))}),
	't', 'the quick flow finished before any of the eight slow steps');
is($node->safe_psql('postgres', q{
SELECT max(s.started_at) < min(s.finished_at)
  FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'slow' AND f.id <> (SELECT min(id) FROM dwarf.flow WHERE graph_id = g.id)}),
	't', 'the eight slow steps ran at the same time');

# ---------------------------------------------------------------- 2. locks
$node->safe_psql('postgres',
	q{SELECT count(*) FROM (SELECT dwarf.create('hot', '{}') FROM generate_series(1, 4000)) c});
$node->poll_query_until('postgres', q{
SELECT count(*) = 0 FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'hot' AND f.status = 'running'}) or diag('hot-row flows did not finish');
is($node->safe_psql('postgres', q{
SELECT string_agg(status || ':' || n, ',') FROM (
  SELECT f.status, count(*) n FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
   WHERE g.name = 'hot' GROUP BY 1 ORDER BY 1) x}),
	'completed:4000', 'every hot-row flow completed, none failed');
is($node->safe_psql('postgres', q{SELECT sum(n) FROM hot}), '16000',
	'every step updated its row exactly once');
note('batches rolled back for a deadlock: '
	  . (() = slurp_file($node->logfile) =~ /rolled back.*deadlock detected/g));

# ---------------------------------------------------------------- 3. cancel
my $fan = $node->safe_psql('postgres', q{SELECT dwarf.create('fan', '{}')});
$node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type IN ('dwarf worker', 'dwarf runner') AND wait_event = 'PgSleep'})
  or diag('no branch started');
$node->safe_psql('postgres', qq{SELECT dwarf.cancel($fan, 'enough')});
sleep(2.5);    # the first branch ends after 1.5 s; the others would take 1.5 s more
is($node->safe_psql('postgres', qq{
SELECT count(*) FROM dwarf.step WHERE flow_id = $fan AND task LIKE 'B%'}),
	'0', 'after the cancel, the running branch was stopped and no other branch ran');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM started WHERE flow_id = $fan}),
	'0', 'and no branch wrote anything');
is($node->safe_psql('postgres', qq{SELECT status FROM dwarf.flow WHERE id = $fan}),
	'cancelled', 'the flow stays cancelled');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
