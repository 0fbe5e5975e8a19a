# Copyright: dwarf project.
#
# DwarfTest: the mechanics the dwarf TAP tests in t/ share, so that each
# test file reads as the story it tells (load, crash or stop, restart, check)
# and not as setup.  It holds:
#
#  - new_node: a started cluster that preloads dwarf with two workers and
#    restarts after a crash;
#  - the test graph "g" and its task functions.  Ten tasks:
#        a1 -> a2 -> a3 -> (b1 | b2 | b3) -> j (fan-in) -> c1 -> c2 -> c3.
#    Every task records itself in public.done (primary key (flow_id, task):
#    a second execution of the same task of the same flow would fail the
#    step) and returns a delta: one to add to "count" and, unless asked
#    otherwise, its name to append to "trail".  A completed flow's state is
#    therefore {count: 10, trail: [a1, ..., c3]} plus its input;
#  - checks on such flows: every flow completed, every task ran exactly once
#    as far as the database can see, the final state is right;
#  - small helpers every test repeats (waiting for the workers, checking the
#    server log for crashes, stopping the node at the end).
#
# The functions that run tests raise $Test::Builder::Level, so that a failure
# names the line of the test file that called them (and a TODO block there
# applies to them).
#
# The test files load it with
#     use FindBin;
#     use lib $FindBin::Bin;
#     use DwarfTest;
# prove runs t/*.pl only, so this file is not taken for a test.
package DwarfTest;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(basename);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;

our @EXPORT = qw(
  @TRAIL $NTASKS $TRAIL_JSON
  new_node start_after_immediate_stop tasks_sql graph_sql create_tasks create_graph
  wait_for_workers check_warm_up_flow wait_flows_closed
  check_flows_exactly_once check_new_flow check_no_crash stop_node
  start_http_server http_stats);

# The tasks of graph "g" in the order they run (the order of a completed
# flow's "trail"), how many there are, and the trail as a JSON array.
our @TRAIL      = qw(a1 a2 a3 b1 b2 b3 j c1 c2 c3);
our $NTASKS     = scalar @TRAIL;
our $TRAIL_JSON = '[' . join(',', map { "\"$_\"" } @TRAIL) . ']';

# new_node($name, %extra_conf): a new cluster, initialized and started, that
# preloads dwarf with 2 workers, room for 16 background workers and
# restart_after_crash on.  %extra_conf adds postgresql.conf settings after
# these (a later line wins, so it can override them); each value is written
# as is: quote strings yourself ('dwarf.workers' => 4, foo => "'1 s'").
sub new_node
{
	my ($name, %extra_conf) = @_;
	my $conf = q{
shared_preload_libraries = 'dwarf'
dwarf.workers = 2
max_worker_processes = 16
restart_after_crash = on
};
	$conf .= "$_ = $extra_conf{$_}\n" for sort keys %extra_conf;

	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', $conf);
	$node->start;
	return $node;
}

# start_after_immediate_stop($node, $message): starts $node again after a
# "pg_ctl stop -m immediate", and one test that the server log shows the
# start recovered from it.
sub start_after_immediate_stop
{
	my ($node, $message) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $log_offset = -s $node->logfile;
	$node->start;
	return like(slurp_file($node->logfile, $log_offset),
		qr/database system was (interrupted|not properly shut down)/, $message);
}

# tasks_sql(trail => 0|1): the SQL that creates public.done, schema app,
# app.work and one function app.<task> per task of graph "g".  It does not
# need the extension to exist.  With trail => 0 (default 1) the tasks return
# only {"count": 1}, not their name for "trail".
sub tasks_sql
{
	my (%opts) = @_;
	my $trail = $opts{trail} // 1;
	my $delta = $trail
	  ? q{pg_catalog.jsonb_build_object('count', 1, 'trail', task)}
	  : q{pg_catalog.jsonb_build_object('count', 1)};
	my $tasks = join(',', map { "'$_'" } @TRAIL);
	return qq{
CREATE TABLE public.done (flow_id bigint, task text, at timestamptz DEFAULT clock_timestamp(),
                          PRIMARY KEY (flow_id, task));
CREATE SCHEMA app;
CREATE FUNCTION app.work(s jsonb, task text) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM pg_catalog.pg_sleep(0.001);
	INSERT INTO public.done (flow_id, task) VALUES (dwarf.flow_id(), task);
	RETURN $delta;
END \$\$;
DO \$\$
DECLARE t text;
BEGIN
	FOREACH t IN ARRAY ARRAY[$tasks] LOOP
		EXECUTE format('CREATE FUNCTION app.%I(s jsonb) RETURNS jsonb LANGUAGE sql '
		               'AS \$f\$ SELECT app.work(s, %L) \$f\$', t, t);
	END LOOP;
END \$\$;
};
}

# graph_sql(trail => 0|1): the SQL that defines graph "g" (the extension must
# exist).  "count" is reduced with add and, unless trail => 0, "trail" with
# append.
sub graph_sql
{
	my (%opts) = @_;
	my $trail = $opts{trail} // 1;
	my $reducers = $trail
	  ? '{"count": "add", "trail": "append"}'
	  : '{"count": "add"}';
	return qq{
SELECT dwarf.define('g', '{
  "tasks": {"a1": "app.a1", "a2": "app.a2", "a3": "app.a3",
            "b1": "app.b1", "b2": "app.b2", "b3": "app.b3", "j": "app.j",
            "c1": "app.c1", "c2": "app.c2", "c3": "app.c3"},
  "transitions": [
    {"chain": ["a1", "a2", "a3"]},
    {"from": "a3", "to": ["b1", "b2", "b3"]},
    {"from": "b1", "to": "j"}, {"from": "b2", "to": "j"}, {"from": "b3", "to": "j"},
    {"chain": ["j", "c1", "c2", "c3", "END"]}],
  "fan_in": ["j"],
  "reducers": $reducers}');
};
}

# create_tasks($node, $dbname, %opts): runs tasks_sql(%opts) in $dbname.
sub create_tasks
{
	my ($node, $dbname, %opts) = @_;
	$node->safe_psql($dbname, tasks_sql(%opts));
}

# create_graph($node, $dbname, %opts): CREATE EXTENSION dwarf, the task
# functions and graph "g" in $dbname, in one psql call.  %opts as for
# tasks_sql and graph_sql.
sub create_graph
{
	my ($node, $dbname, %opts) = @_;
	$node->safe_psql($dbname,
		"CREATE EXTENSION dwarf;\n" . tasks_sql(%opts) . graph_sql(%opts));
}

# wait_for_workers($node, $message, count => N, db => NAME): one test that
# waits until N (default 2) dwarf workers run; with db, only those of that
# database are counted.
sub wait_for_workers
{
	my ($node, $message, %args) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $count = $args{count} // 2;
	my $query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker'";
	$query .= " AND datname = '$args{db}'" if defined $args{db};
	return ok($node->poll_query_until($args{db} // 'postgres', $query, $count), $message);
}

# check_warm_up_flow($node, $dbname): one test that dwarf.run of graph "g"
# (with trail) completes with count 10 and the trail in graph order.
sub check_warm_up_flow
{
	my ($node, $dbname) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return is(
		$node->safe_psql($dbname,
			"SET statement_timeout = '90 s';
			 SELECT status || ' ' || (state->>'count') || ' ' || (state->'trail' = '$TRAIL_JSON'::jsonb)
			   FROM dwarf.run('g', '{\"n\": 0, \"src\": \"warmup\"}', timeout => '60 s')"),
		"completed $NTASKS true",
		'a warm-up flow completes with the expected state');
}

# wait_flows_closed($node, $dbname, $message): one test that waits until no
# flow in dwarf.flow is running; on failure, shows dwarf.stats and what the
# workers are doing.
sub wait_flows_closed
{
	my ($node, $dbname, $message) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return ok(
		$node->poll_query_until($dbname,
			"SELECT count(*) FROM dwarf.flow WHERE status = 'running'", '0'),
		$message)
	  || diag $node->safe_psql($dbname,
		"SELECT running, completed, failed, steps_done, workers FROM dwarf.stats;
		 SELECT pid, state, wait_event_type, wait_event, query, now() - query_start
		   FROM pg_stat_activity WHERE backend_type = 'dwarf worker'");
}

# check_flows_exactly_once($node, $dbname, when => TEXT): everything we can
# say about a finished load of graph "g" (with trail), for every flow in
# dwarf.flow: all completed without error, no step failed, each task's write
# in public.done and its step row are there exactly once per flow, and the
# final state is {count: 10, trail: [a1..c3], n: input n}.  Ten tests; TEXT
# ends their messages ("after the worker crash").
sub check_flows_exactly_once
{
	my ($node, $dbname, %args) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $when  = $args{when} // '';
	my $total = $node->safe_psql($dbname, 'SELECT count(*) FROM dwarf.flow');
	note "$total flows in dwarf.flow $when";

	is( $node->safe_psql($dbname,
			"SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
			   FROM (SELECT status, count(*) n FROM dwarf.flow GROUP BY status) s"),
		"completed=$total", "all $total flows completed $when");
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM dwarf.flow WHERE error IS NOT NULL"),
		'0', "no flow has an error $when")
	  or diag $node->safe_psql($dbname,
		"SELECT id, status, error FROM dwarf.flow WHERE error IS NOT NULL LIMIT 10");
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM dwarf.step WHERE status = 'failed' OR error IS NOT NULL"),
		'0', "no step failed (no duplicate-key error from a re-run task) $when")
	  or diag $node->safe_psql($dbname,
		"SELECT flow_id, task, attempt, error->>'message' FROM dwarf.step
		  WHERE status = 'failed' OR error IS NOT NULL LIMIT 10");

	# Each task's SQL write happened once per flow.
	is($node->safe_psql($dbname, 'SELECT count(*) FROM public.done'),
		$NTASKS * $total, "done has $NTASKS rows per flow in total $when");
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM dwarf.flow f
			  WHERE (SELECT count(*) FROM public.done d WHERE d.flow_id = f.id) <> $NTASKS"),
		'0', "every flow has exactly $NTASKS done rows $when");
	is( $node->safe_psql($dbname,
			'SELECT count(*) FROM public.done d WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.id = d.flow_id)'),
		'0', "no done row belongs to an unknown flow $when");

	# The step log: one completed row per (flow, task), nothing else.
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM (SELECT flow_id, task FROM dwarf.step
			                        GROUP BY flow_id, task HAVING count(*) <> 1) x"),
		'0', "dwarf.step has exactly one row per (flow, task) $when")
	  or diag $node->safe_psql($dbname,
		"SELECT flow_id, task, count(*) FROM dwarf.step GROUP BY 1, 2 HAVING count(*) <> 1 LIMIT 10");
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM dwarf.step WHERE status = 'completed'"),
		$NTASKS * $total, "dwarf.step has $NTASKS completed steps per flow $when");
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM dwarf.step s FULL JOIN public.done d
			     ON d.flow_id = s.flow_id AND d.task = s.task
			  WHERE s.flow_id IS NULL OR d.flow_id IS NULL"),
		'0', "every step row has its task's write and every write its step row $when");

	# The final state: the counter added up, the trail in graph order, the input kept.
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM dwarf.flow
			  WHERE state IS NULL
			     OR state->'count' IS DISTINCT FROM '$NTASKS'::jsonb
			     OR state->'trail' IS DISTINCT FROM '$TRAIL_JSON'::jsonb
			     OR state->'n' IS DISTINCT FROM input->'n'"),
		'0', "every flow's final state is {count: 10, trail: [a1..c3], n: input n} $when")
	  or diag $node->safe_psql($dbname,
		"SELECT id, input, state FROM dwarf.flow
		  WHERE state IS NULL OR state->'count' IS DISTINCT FROM '$NTASKS'::jsonb
		     OR state->'trail' IS DISTINCT FROM '$TRAIL_JSON'::jsonb LIMIT 5");
	is( $node->safe_psql($dbname,
			"SELECT count(*) FROM dwarf.flow WHERE finished_at IS NULL"),
		'0', "every flow has finished_at $when");
}

# check_new_flow($node, $dbname, $message): one test that a new flow of
# graph "g" runs to completion with count 10 (dwarf.run; statement_timeout
# bounds the wait even if dwarf.run ignored its own timeout).
sub check_new_flow
{
	my ($node, $dbname, $message) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($rc, $out, $err) = $node->psql($dbname,
		q{SET statement_timeout = '90 s';
		  SELECT status || ' ' || (state->>'count') FROM dwarf.run('g', '{"n": -1}', timeout => '60 s')});
	return is($out, "completed $NTASKS", $message) || diag $err;
}

# check_no_crash($node, $message): one test that the server log has no sign
# of a crash: no backend terminated by a signal or exception, no PANIC, no
# assertion failure, no crash restart.  (Immediate stops leave no such line.)
sub check_no_crash
{
	my ($node, $message) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return unlike(slurp_file($node->logfile),
		qr/terminated by signal|terminated by exception|PANIC|TRAP:|all server processes terminated/,
		$message);
}

# stop_node($node, $t0): notes how long the test took since $t0 (a
# Time::HiRes time) and stops the node: "fast" when every test so far
# passed, "immediate" otherwise, as a wedged worker may not answer SIGTERM.
sub stop_node
{
	my ($node, $t0) = @_;
	note sprintf('%s took %.1f s', basename($0, '.pl'), time - $t0);
	$node->stop(Test::More->builder->is_passing ? 'fast' : 'immediate');
}


# start_http_server([NAME]): the project's test HTTP server
# (test/http_server.py) on 127.0.0.1 and a free port; returns its base URL
# ("http://127.0.0.1:PORT") and its IPC::Run handle (kill_kill it at the end).
sub start_http_server
{
	my ($name) = @_;
	my $portfile = PostgreSQL::Test::Utils::tempdir() . '/' . ($name // 'http') . '.port';
	my $h = IPC::Run::start([ 'python3', "$FindBin::Bin/../test/http_server.py", $portfile ]);
	my $waited = 0;
	select(undef, undef, undef, 0.1) while !-s $portfile && $waited++ < 300;
	die "the test HTTP server did not start" unless -s $portfile;
	return ('http://127.0.0.1:' . slurp_file($portfile), $h);
}

# http_stats(BASE): the counts of the test HTTP server at BASE (its /stats,
# see test/http_server.py), asked without any proxy the environment names.
my $stats_client = HTTP::Tiny->new(timeout => 30, proxy => undef, http_proxy => undef);

sub http_stats
{
	my ($base) = @_;
	my $r = $stats_client->get("$base/stats");
	die "stats: $r->{status}" unless $r->{success};
	return decode_json($r->{content});
}

1;
