# Copyright: dwarf project.
#
# 195_offers_after_commit.pl: a step of an external task is offered only
# once the commit that leads to it is done, and an offer is withdrawn only
# by a commit: a batch that rolls back leaves offers and leases as the
# flows' rows say.
#
#  1. a batch that fans out to an external and a function step, and then
#     takes a slow step of the same flow off the queue (RefillBatch, which
#     queued that flow again inside the batch), is held in its commit
#     (waiting for a synchronous standby): the external step is not
#     claimable meanwhile; once the commit is done, it is claimed once,
#     with the input of that commit;
#  2. a lease whose answer's batch rolls back (a deferred trigger on
#     dwarf.answer fails that commit once): the answer is recorded once by
#     the batch run again, the lease stays answered (a second complete is
#     refused as answered), and the flow completes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

# One worker, a batch that takes its steps one at a time from the queue
# (dwarf.batch_size / 8 = 1), a task slow from 200 ms on, and WAL senders
# (commits wait for synchronous standbys only with some).
my $node = new_node('offers_after_commit',
	'dwarf.workers' => 1,
	'dwarf.batch_size' => 8,
	'dwarf.long_step' => 200,
	'dwarf.min_retry_delay' => 0,
	'wal_level' => 'replica',
	'max_wal_senders' => 2);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE SEQUENCE app.a_seq;
CREATE SEQUENCE app.fail_seq;
-- a row here arms a check at commit that fails the first commit only
-- the worker's delete of an answer it recorded arms a check at commit
-- (a task cannot: it runs as a security-restricted operation) that fails
-- the first commit only
CREATE FUNCTION app.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('app.fail_seq') = 1 THEN
		RAISE EXCEPTION 'the commit fails once (answer)';
	END IF;
	RETURN NULL;
END $$;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.start(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep('3 s');
	RETURN '{}';
END $$;
-- A: the fan-out's step; its changes differ at each run
CREATE FUNCTION app.a(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('n', nextval('app.a_seq')) $$;
-- slow only when the input says so; a slow run makes the task slow (lent)
CREATE FUNCTION app.slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF s ? 'slow' THEN PERFORM pg_sleep(0.6); END IF;
	RETURN '{}';
END $$;
CREATE FUNCTION app.after(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('after', s->'answer') $$;
SELECT dwarf.define('warm', '{"tasks": {"S": "app.slow"}, "transitions": [{"from": "S", "to": "END"}]}');
SELECT dwarf.define('fan', '{"entry": "Start",
  "tasks": {"Start": "app.start", "A": "app.a", "S": "app.slow", "Y": "app.noop",
            "X": {"external": "q", "lease": "1 min"}},
  "transitions": [{"from": "Start", "to": ["A", "S"]}, {"from": "A", "to": ["X", "Y"]},
    {"from": "X", "to": "END"}, {"from": "Y", "to": "END"}, {"from": "S", "to": "END"}]}');
SELECT dwarf.define('ans', '{"tasks": {"X": {"external": "q2", "lease": "1 min"}, "Z": "app.after"},
  "transitions": [{"chain": ["X", "Z", "END"]}]}');
});
wait_for_workers($node, 'the worker runs', count => 1);

# ------------------------------------------------------------------ 1. fan-out rolled back
# A slow run of app.slow (preempted in the worker, run in a runner) makes
# the task slow: a step of it is lent from now on.
is($node->safe_psql('postgres', q{SET statement_timeout = '90 s';
	SELECT status FROM dwarf.run('warm', '{"slow": true}', timeout => '60 s')}),
	'completed', 'a slow run of app.slow completes (in a runner)');
like(slurp_file($node->logfile), qr/ran past dwarf\.long_step/,
	'app.slow ran past dwarf.long_step: its steps are lent from now on');

# Start sleeps 3 s, then A and S are ready, A first.  Priority 1: no
# successor chains, so the batch that runs A takes S off the queue after
# it (RefillBatch), finds it slow, and leaves it for a runner.  Meanwhile
# commits wait for a synchronous standby that does not exist: the batch's
# commit is held, not yet durable, with A's fan-out to X and Y done.
my $id = $node->safe_psql('postgres', q{SELECT dwarf.create('fan', '{}', priority => 1)});
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) FROM dwarf.step WHERE flow_id = $id AND task = 'Start'}, '1'),
	'Start ran (A and S come due 3 s later)');
$node->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = 'nobody';
	SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'dwarf worker' AND wait_event = 'SyncRep'}, '1'),
	"the commit of the batch that ran A waits");
is($node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.claim('q', 10, NULL, '2 s')}), '0',
	'X is not claimable before the commit that leads to it is done');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM dwarf.external_steps('q')}), '0',
	'X is not offered before the commit that leads to it is done');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET synchronous_standby_names;
	SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) > 0 FROM dwarf.step WHERE flow_id = $id AND task = 'A'}),
	'A committed');
my $n = $node->safe_psql('postgres',
	qq{SELECT changes->>'n' FROM dwarf.step WHERE flow_id = $id AND task = 'A'});
is($n, '1', "A ran once");

# Every claimable step of q: exactly X, once, with the committed state.
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) > 0 FROM dwarf.external_steps('q') WHERE flow_id = $id}),
	'X is offered after the commit');
my $claimed = $node->safe_psql('postgres', q{
	SELECT string_agg(lease || ' ' || task || ' ' || (input->>'n'), ',')
	  FROM dwarf.claim('q', 10, NULL, '1 s')});
my ($lease1, $rest) = split / /, $claimed, 2;
is($rest, "X $n", 'X is claimed once, with the input its committed fan-out gave it');
$node->safe_psql('postgres', qq{SELECT dwarf.complete($lease1, '{}')});
is($node->safe_psql('postgres', qq{SET statement_timeout = '60 s';
	SELECT status FROM dwarf.await($id, '50 s')}), 'completed', 'the fan-out flow completes');
is($node->safe_psql('postgres', qq{SELECT string_agg(task, ',' ORDER BY task)
	FROM dwarf.step WHERE flow_id = $id}), 'A,S,Start,X,Y', 'each of its steps ran once');

# ------------------------------------------------------------------ 2. answer's batch rolled back
$node->safe_psql('postgres', q{
CREATE CONSTRAINT TRIGGER answer_check AFTER DELETE ON dwarf.answer
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION app.fail_once()});
my $id2 = $node->safe_psql('postgres', q{SELECT dwarf.create('ans', '{}')});
my $lease2 = $node->safe_psql('postgres', q{SELECT lease FROM dwarf.claim('q2', 1, NULL, '20 s')});
ok($lease2 =~ /^\d+$/, 'X of flow 2 is claimed');
my $log = -s $node->logfile;
$node->safe_psql('postgres', qq{SELECT dwarf.complete($lease2, '{"answer": "yes"}')});
is($node->safe_psql('postgres', qq{SET statement_timeout = '60 s';
	SELECT status || ' ' || (state->>'after') FROM dwarf.await($id2, '50 s')}),
	'completed yes', 'the flow whose answer was recorded by a batch rolled back completes');
like(slurp_file($node->logfile, $log), qr/the commit fails once \(answer\)/,
	"the batch that first recorded the answer rolled back at its commit");
is($node->safe_psql('postgres', qq{SELECT string_agg(task || ':' || status, ',' ORDER BY step_id)
	FROM dwarf.step WHERE flow_id = $id2}), 'X:completed,Z:completed',
	'the answer is recorded once, and what follows it runs once');
my ($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.complete($lease2, '{}')});
like($err, qr/already completed or failed/, 'a second complete of the lease is refused as answered');

done_testing();
