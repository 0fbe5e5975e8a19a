# Copyright: dwarf project.
#
# 140_orderly_restarts.pl: only a step that ends its own process is blamed
# for it (crashes.c); an orderly stop, a copy of the data directory and
# another poison step are not that step's crash.
#
#  1. A step in flight while the server stops ("pg_ctl stop -m fast") three
#     times, once in a runner and then in a worker, and while its worker is
#     ended by pg_terminate_backend: the flow completes.  So does a step
#     whose runner is ended by pg_terminate_backend three times.
#  2. A base backup taken while a step is in flight, started as a server of
#     its own: no step is blamed there, and the flow completes on both.
#  3. Two poison steps (tasks that SIGKILL their own process) in flows of one
#     worker, crashing in turn: each fails after dwarf.step_crashes tries
#     with the error that says so.  A poison step with an on_error edge
#     fails the same way, and its handler runs and completes the flow.
#
# Determinism: task app.nap waits, in pg_sleep, until the test opens
# app.gate; every stop, copy or kill comes while the step is seen sleeping
# (polled for, never a timed sleep).  app.nap with {"nap": seconds} just
# sleeps: a warm-up flow that naps past dwarf.long_step makes the task slow,
# so that the next step goes to a runner (lend.c).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

# The server log's lines that blame a step for ending its process.
sub blamed
{
	my ($n) = @_;
	return join('', grep { /ended the process running it/ } split /^/, slurp_file($n->logfile));
}

my $t0   = time;
my $node = new_node('orderly', 'dwarf.long_step' => "'250ms'", max_wal_senders => 2,
	wal_level => 'replica');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE TABLE app.gate (open boolean NOT NULL);
INSERT INTO app.gate VALUES (false);
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF s ? 'nap' THEN
		PERFORM pg_catalog.pg_sleep((s->>'nap')::float8);
		RETURN '{}';
	END IF;
	FOR i IN 1 .. 1800 LOOP		-- three minutes at most
		EXIT WHEN (SELECT open FROM app.gate);
		PERFORM pg_catalog.pg_sleep(0.1);
	END LOOP;
	RETURN '{"through": true}';
END $$;
SELECT dwarf.define('nap', '{"tasks": {"N": "app.nap"}}');
});
wait_for_workers($node, 'two workers run');

# The dwarf process whose task sleeps in app.nap (none: '').
sub napper
{
	my ($n) = @_;
	return $n->safe_psql('postgres', q{
SELECT backend_type || ':' || pid FROM pg_stat_activity
 WHERE backend_type IN ('dwarf worker', 'dwarf runner') AND wait_event = 'PgSleep'});
}

# Waits until flow $id's step sleeps in app.nap, or the flow is no longer
# running; returns napper() as seen by the query that found it so (a step
# can move from a worker to a runner between two queries: no second look).
sub wait_napping
{
	my ($n, $id) = @_;
	for (1 .. 10 * $PostgreSQL::Test::Utils::timeout_default)
	{
		my $seen = $n->safe_psql('postgres', qq{
SELECT coalesce((SELECT backend_type || ':' || pid FROM pg_stat_activity
                  WHERE backend_type IN ('dwarf worker', 'dwarf runner') AND wait_event = 'PgSleep'
                  LIMIT 1),
                CASE WHEN (SELECT status <> 'running' FROM dwarf.flow WHERE id = $id) THEN 'closed' END,
                '')});
		return $seen eq 'closed' ? '' : $seen if $seen ne '';
		Time::HiRes::usleep(100_000);
	}
	diag "flow $id: its step never slept";
	return '';
}

# Opens the gate and waits until flow $id has closed; returns "status error".
sub open_gate_and_wait
{
	my ($n, $id) = @_;
	$n->safe_psql('postgres', 'UPDATE app.gate SET open = true');
	$n->poll_query_until('postgres', qq{SELECT status <> 'running' FROM dwarf.flow WHERE id = $id})
	  or diag "flow $id still runs";
	my $out = $n->safe_psql('postgres',
		qq{SELECT status || ' ' || coalesce(error, '') FROM dwarf.flow WHERE id = $id});
	$n->safe_psql('postgres', 'UPDATE app.gate SET open = false');
	return $out;
}

# Makes task app.nap slow, for this server's life: its next step goes to a runner.
sub make_slow
{
	my ($n) = @_;
	is($n->safe_psql('postgres', q{SELECT status FROM dwarf.run('nap', '{"nap": 0.5}', timeout => '60 s')}),
		'completed', 'a warm-up flow naps past dwarf.long_step');
}

# ---------------------------------------------------------------- 1. stops
make_slow($node);
my $x = $node->safe_psql('postgres', q{SELECT dwarf.create('nap', '{}')});
like(wait_napping($node, $x), qr/^dwarf runner:\d+$/, 'the step of a slow task sleeps in a runner');
for my $round (1 .. 3)
{
	$node->stop('fast');
	# Before the last start, the task stops counting as slow for long: a
	# restart forgets which tasks are slow, so the step runs in a worker,
	# and there it is preempted after dwarf.long_step.  What is checked
	# next is a step in a worker, whatever the machine's speed.
	$node->append_conf('postgresql.conf', "dwarf.long_step = '1h'") if $round == 3;
	$node->start;
	like(wait_napping($node, $x), qr/^dwarf (worker|runner):\d+$/,
		"after fast stop $round the step runs again");
}
my ($type, $pid) = split /:/, napper($node);
is($type // '', 'dwarf worker', 'after a restart the step runs in a worker');
if (defined $pid)
{
	is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"), 't',
		'pg_terminate_backend of the worker running the step');
	$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
	  or diag "worker $pid still runs";
	like(wait_napping($node, $x), qr/^dwarf (worker|runner):\d+$/,
		'the step runs again after its worker was terminated');
}
is(open_gate_and_wait($node, $x), 'completed ',
	'a step stopped three times by pg_ctl stop -m fast and once by pg_terminate_backend completes');

# The same step's runner terminated three times, its worker left running.
$node->append_conf('postgresql.conf', "dwarf.long_step = '250ms'");
$node->restart;    # not a reload: the workers have the setting when it returns
wait_for_workers($node, 'the workers run again');
make_slow($node);
my $y = $node->safe_psql('postgres', q{SELECT dwarf.create('nap', '{}')});
for my $round (1 .. 3)
{
	($type, $pid) = split /:/, wait_napping($node, $y);
	is($type // '', 'dwarf runner', "round $round: the step sleeps in a runner");
	last unless defined $pid;
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
	  or diag "runner $pid still runs";
}
like(wait_napping($node, $y), qr/^dwarf (worker|runner):\d+$/,
	'the step runs again after its runner was terminated three times');
is(open_gate_and_wait($node, $y), 'completed ',
	'a step whose runner was terminated three times completes');
is(blamed($node), '', 'no step was blamed for an orderly stop');

# ---------------------------------------------------------------- 2. a copy
my $z = $node->safe_psql('postgres', q{SELECT dwarf.create('nap', '{}')});
like(wait_napping($node, $z), qr/^dwarf (worker|runner):\d+$/, 'a step is in flight at the backup');
$node->backup('inflight');
my $copy = PostgreSQL::Test::Cluster->new('copy');
$copy->init_from_backup($node, 'inflight');
$copy->start;
wait_for_workers($copy, 'the copy runs its workers');
is(open_gate_and_wait($copy, $z), 'completed ', 'the flow completes on the copy');
is(blamed($copy), '', 'the copy blames no step for the source\'s step in flight');
like(slurp_file($copy->logfile), qr/"dwarf.crashes" is not this data directory's own; it starts afresh/,
	'the copy says it set the source\'s notes aside');
is(open_gate_and_wait($node, $z), 'completed ', 'and on the source');
$copy->stop('fast');
stop_node($node, $t0);

# ---------------------------------------------------------------- 3. poison
my $pnode = new_node('poisons', 'dwarf.workers' => 1);
$pnode->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.kill9(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	COPY (SELECT 1) TO PROGRAM 'kill -KILL $PPID';
	RETURN '{}';
END $$;
SELECT dwarf.define('kill', '{"tasks": {"K": "app.kill9"}}');
SELECT dwarf.define('kill_handled', '{"tasks": {"K": "app.kill9", "H": "app.noop"},
  "transitions": [{"from": "K", "to": "H", "on_error": true}]}');
});
wait_for_workers($pnode, 'one worker runs', count => 1);

my ($p1, $p2) = split /\n/, $pnode->safe_psql('postgres', q{
SELECT dwarf.create('kill', '{}') FROM generate_series(1, 2)});
$pnode->poll_query_until('postgres', qq{
SELECT count(*) = 0 FROM dwarf.flow WHERE id IN ($p1, $p2) AND status = 'running'})
  or diag 'the poison flows still run';
for my $p ($p1, $p2)
{
	is($pnode->safe_psql('postgres', qq{SELECT status || ': ' || error FROM dwarf.flow WHERE id = $p}),
		'failed: task "K" ended the process running it 3 times; it is not run again',
		"poison flow $p fails after three crashes, though another poison step crashed in between");
}

my $p3 = $pnode->safe_psql('postgres', q{SELECT dwarf.create('kill_handled', '{}')});
$pnode->poll_query_until('postgres', qq{SELECT status <> 'running' FROM dwarf.flow WHERE id = $p3})
  or diag 'the handled poison flow still runs';
is($pnode->safe_psql('postgres', qq{SELECT status || ': ' || (state->'onErr'->>'message') FROM dwarf.flow WHERE id = $p3}),
	'completed: task "K" ended the process running it 3 times; it is not run again',
	'a poison step fails after three crashes into its on_error handler, which runs');
stop_node($pnode, $t0);

done_testing();
