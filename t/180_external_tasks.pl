# Copyright: dwarf project.
#
# 180_external_tasks.pl: steps of external tasks ({"external": "queue"}),
# done by a worker outside the server with dwarf.claim and dwarf.complete.
#
#  1. a claim returns the waiting step (flow, task, attempt, input, baggage,
#     step key) and writes nothing; the complete, in the outside worker's
#     own transaction, makes the step and that transaction's writes happen
#     together, once: a rolled-back complete leaves the lease held and
#     nothing written, a second complete of the same lease is refused;
#  2. a lease that runs out fails its attempt (a history row), offers the
#     step again as the next attempt, and fences the old holder; extend
#     keeps a lease;
#  3. dwarf.fail follows the task's retry policy: retried while attempts
#     remain, then the step fails and its on_error edge is taken; a
#     failure that is not retryable fails at once;
#  4. a cancel while a step is leased: the flow ends cancelled, the complete
#     is refused and writes nothing;
#  5. another role can neither claim alice's steps nor answer her leases;
#  6. a claim waiting on an empty queue is woken by a step that becomes
#     ready, and one that times out returns nothing;
#  7. a server crash with leases out: every waiting step is offered again,
#     the old leases are refused, and each flow completes once;
#  8. the README's two workers (in plain SQL, and in a shell with psql) do
#     what it says;
#  9. a named limit on an external task bounds its claimed steps: never more
#     leased at once than its concurrency (per key, when it has one), a place
#     given back when a step is answered or its lease runs out;
# 10. a crash just after answers commit (the worker records them without
#     waiting for its own commit to reach the disk: the answers are durable)
#     loses none: each step is recorded once, with its changes.
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

my $t0   = time;
my $node = new_node('external_tasks', 'dwarf.min_retry_delay' => 0);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice, bob;
GRANT CREATE ON SCHEMA app TO alice;
-- the outside worker's own writes, made in the complete's transaction
CREATE TABLE app.charged (flow_id bigint PRIMARY KEY, amount int);
GRANT ALL ON app.charged TO alice, bob;
CREATE FUNCTION app.prepare(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('prepared', true) $$;
CREATE FUNCTION app.finish(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('finished', s->'answer') $$;
CREATE FUNCTION app.handle(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('handled', s->'onErr'->>'message') $$;
});
wait_for_workers($node, 'two workers run');

# prepare -> charge (external, queue "pay") -> finish; a failed charge goes
# to handle.
$node->safe_psql('postgres', q{
SELECT dwarf.define('pay', '{"tasks": {
	"prepare": "app.prepare",
	"charge": {"external": "pay", "lease": "1 min", "retry": {"attempts": 3, "initial": "10 ms"}},
	"finish": "app.finish",
	"handle": "app.handle"},
  "transitions": [{"chain": ["prepare", "charge", "finish", "END"]},
	{"from": "charge", "to": "handle", "on_error": true}, {"from": "handle", "to": "END"}]}')},
	extra_params => [ '-U', 'alice' ]);

# psql as alice (or as $role), returning the output of $sql.
sub as
{
	my ($role, $sql) = @_;
	return $node->safe_psql('postgres', $sql, extra_params => [ '-U', $role ]);
}

# Creates a flow of "pay" as alice; returns its id.
sub new_flow
{
	my ($input) = @_;
	return as('alice', qq{SELECT dwarf.create('pay', '$input', baggage => '{"tenant": "t1"}')});
}

# Claims one step of queue "pay" (waiting up to 20 s) as $role, with lease
# $lease ('NULL' for the task's); returns "lease|flow|task|attempt|input|baggage|step_key".
sub claim
{
	my ($role, $lease) = @_;
	$lease //= 'NULL';
	return as($role, qq{SELECT lease || '|' || flow_id || '|' || task || '|' || attempt || '|' ||
		input::text || '|' || coalesce(baggage::text, '') || '|' || step_key
		FROM dwarf.claim('pay', 1, $lease, '20 s')});
}

# The outcome of a flow once closed: "status|state|error".
sub outcome
{
	my ($id) = @_;
	return as('alice', qq{SET statement_timeout = '60 s';
		SELECT status || '|' || coalesce(state::text, '') || '|' || coalesce(error, '')
		FROM dwarf.await($id, '50 s')});
}

# The flow's step rows: "task:status:attempt" in order, comma-separated.
sub history
{
	my ($id) = @_;
	return as('alice', qq{SELECT string_agg(task || ':' || status || ':' || attempt, ',' ORDER BY step_id)
		FROM dwarf.step WHERE flow_id = $id});
}

# ------------------------------------------------------------------ 1. claim, complete
my $id = new_flow('{"amount": 5}');
my ($lease, $flow, $task, $attempt, $input, $baggage, $key) = split /\|/, claim('alice');
is($flow, $id, 'the claim returns the flow');
is("$task $attempt", 'charge 1', 'the claim returns the task and the first attempt');
is($input, '{"amount": 5, "prepared": true}', 'the claim returns the input state');
is($baggage, '{"tenant": "t1"}', 'the claim returns the baggage');
is($key, "$id-0-1-charge", 'the claim returns the step key');
is(as('alice', q{SELECT count(*) FROM dwarf.claim('pay', 10)}), '0',
	'a leased step is not claimed again');
is(as('alice', qq{SELECT queue || ' ' || task || ' ' || attempt || ' ' || state || ' ' || (lease_until > leased_at)
	FROM dwarf.external_steps() WHERE flow_id = $id}), 'pay charge 1 leased true',
	'dwarf.external_steps shows the step leased');
is(as('bob', q{SELECT count(*) FROM dwarf.external_steps()}), '0',
	"bob does not see alice's steps in dwarf.external_steps");

# A complete that rolls back writes nothing and leaves the lease held.
my ($rc, $out, $err) = $node->psql('postgres', qq{
BEGIN;
INSERT INTO app.charged VALUES ($id, 5);
SELECT dwarf.complete($lease, '{"answer": "paid"}');
ROLLBACK;}, extra_params => [ '-U', 'alice' ]);
is($rc, 0, 'a complete in a transaction that rolls back');
is(as('alice', qq{SELECT count(*) FROM app.charged WHERE flow_id = $id}), '0',
	"the rolled-back complete's own write is gone");
is(history($id), 'prepare:completed:1', 'the rolled-back complete recorded no step');

as('alice', qq{BEGIN;
INSERT INTO app.charged VALUES ($id, 5);
SELECT dwarf.complete($lease, '{"answer": "paid"}');
COMMIT;});
is(outcome($id), 'completed|{"amount": 5, "answer": "paid", "finished": "paid", "prepared": true}|',
	'the completed step moves the flow on with its changes');
is(history($id), 'prepare:completed:1,charge:completed:1,finish:completed:1',
	'one step row for the external step');
is(as('alice', qq{SELECT count(*) FROM app.charged WHERE flow_id = $id}), '1',
	"the complete's own write is there once");
($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.complete($lease, '{"answer": "twice"}')},
	extra_params => [ '-U', 'alice' ]);
like($err, qr/was already completed or failed/, 'a second complete of the lease is refused');
is(as('postgres', q{SELECT count(*) FROM dwarf.answer}), '0', 'no answer is left behind');

# ------------------------------------------------------------------ 2. lease expiry
$id = new_flow('{"amount": 7}');
($lease) = split /\|/, claim('alice', q{'1 s'});
my $extended = as('alice', qq{SELECT dwarf.extend($lease, '2 s') > now() + interval '1.5 s'});
is($extended, 't', 'extend moves the lease on');
my ($lease2, $flow2, $task2, $attempt2) = split /\|/, claim('alice', q{'1 min'});
is("$flow2 $attempt2", "$id 2", 'the step whose lease ran out is claimed again as attempt 2');
($rc, $out, $err) = $node->psql('postgres', qq{
BEGIN;
INSERT INTO app.charged VALUES ($id, 7);
SELECT dwarf.complete($lease, '{"answer": "late"}');
COMMIT;}, extra_params => [ '-U', 'alice' ]);
like($err, qr/has expired/, "the old holder's complete is refused: its lease expired");
is(as('alice', qq{SELECT count(*) FROM app.charged WHERE flow_id = $id}), '0',
	"the old holder's write rolled back with its complete");
($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.extend($lease, '1 min')},
	extra_params => [ '-U', 'alice' ]);
like($err, qr/has expired/, 'an expired lease is not extended');
as('alice', qq{SELECT dwarf.complete($lease2, '{"answer": "on time"}')});
like(outcome($id), qr/^completed\|.*"finished": "on time"/, 'the second attempt completes the flow');
is(history($id), 'prepare:completed:1,charge:retry:1,charge:completed:2,finish:completed:1',
	'history: the expired attempt, then the one that completed');
like(as('alice', qq{SELECT error->>'message' FROM dwarf.step WHERE flow_id = $id AND status = 'retry'}),
	qr/lease of attempt 1 of external task "charge" ran out/, "the expired attempt's row says why");

# ------------------------------------------------------------------ 3. fail and the retry policy
$id = new_flow('{"amount": 9}');
for my $n (1 .. 3)
{
	my ($l, $f, $t, $a) = split /\|/, claim('alice');
	is($a, $n, "attempt $n is offered");
	as('alice', qq{SELECT dwarf.fail($l, 'card declined $n')});
}
like(outcome($id), qr/^completed\|.*"handled": "card declined 3"/,
	'after the last attempt fails, the on_error edge is taken with its error');
is(history($id),
	'prepare:completed:1,charge:retry:1,charge:retry:2,charge:failed:3,handle:completed:1',
	'history: a row per attempt');

$id = new_flow('{"amount": 11}');
($lease) = split /\|/, claim('alice');
as('alice', qq{SELECT dwarf.fail($lease, 'no such card', retryable => false)});
like(outcome($id), qr/^completed\|.*"handled": "no such card"/,
	'a failure that is not retryable fails the step at once');

# ------------------------------------------------------------------ 4. cancel during a lease
$id = new_flow('{"amount": 13}');
($lease) = split /\|/, claim('alice');
is(as('alice', qq{SELECT dwarf.cancel($id, 'changed my mind')}), 't', 'the flow is cancelled');
($rc, $out, $err) = $node->psql('postgres', qq{
BEGIN;
INSERT INTO app.charged VALUES ($id, 13);
SELECT dwarf.complete($lease, '{"answer": "too late"}');
COMMIT;}, extra_params => [ '-U', 'alice' ]);
like($err, qr/cancelled|closed/, "the cancelled flow's step takes no answer");
is(as('alice', qq{SELECT count(*) FROM app.charged WHERE flow_id = $id}), '0',
	'nothing of the refused complete is written');
is(as('alice', qq{SELECT status FROM dwarf.flow WHERE id = $id}), 'cancelled', 'the flow stays cancelled');

# ------------------------------------------------------------------ 5. roles
$id = new_flow('{"amount": 15}');
is(as('bob', q{SELECT count(*) FROM dwarf.claim('pay', 10, NULL, '300 ms')}), '0',
	"bob cannot claim alice's steps");
($lease) = split /\|/, claim('alice');
($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.complete($lease, '{}')},
	extra_params => [ '-U', 'bob' ]);
like($err, qr/permission denied/, "bob cannot complete alice's lease");
($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.extend($lease, '1 h')},
	extra_params => [ '-U', 'bob' ]);
like($err, qr/permission denied/, "bob cannot extend alice's lease");
as('postgres', q{GRANT alice TO bob});
as('bob', qq{SELECT dwarf.complete($lease, '{"answer": "by bob"}')});
like(outcome($id), qr/^completed\|.*"finished": "by bob"/,
	"a member of alice's role may answer her steps");

# ------------------------------------------------------------------ 6. a waiting claim
my $waiter = $node->background_psql('postgres', on_error_stop => 1, extra_params => [ '-U', 'alice' ]);
$waiter->query_until(qr/waiting/, q{
\echo waiting
SELECT flow_id AS woken FROM dwarf.claim('pay', 1, NULL, '60 s');
});
ok($node->poll_query_until('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%dwarf.claim(''pay'', 1, NULL, ''60 s'')%'
		  AND wait_event_type = 'Extension'}, '1'),
	'the claim waits in the server');
$id = new_flow('{"amount": 17}');
my $woken = $waiter->query_safe(q{SELECT 1});
like($woken, qr/\b$id\b/, 'the waiting claim returns the step that became ready');
$waiter->quit;
is(as('alice', q{SELECT count(*) FROM dwarf.claim('pay', 1, NULL, '200 ms')}), '0',
	'a claim that waits for nothing returns nothing');

# ------------------------------------------------------------------ 7. a crash with leases out
my @ids = map { new_flow(qq{{"amount": $_}}) } (100 .. 104);
my $leases = as('alice', q{SELECT string_agg(lease::text, ' ') FROM dwarf.claim('pay', 100, NULL, '20 s')});
my @old = split / /, $leases;
is(scalar(@old), 5, 'leases are out');
# and the step section 6 claimed, never answered
my $waiting = as('alice', q{SELECT count(*) FROM dwarf.flow WHERE status = 'running'});
is($waiting, '6', 'six flows wait for their external step');
$node->stop('immediate');
$node->start;
wait_for_workers($node, 'the workers run again after the crash');
($rc, $out, $err) = $node->psql('postgres', qq{SELECT dwarf.complete($old[0], '{"answer": "old"}')},
	extra_params => [ '-U', 'alice' ]);
like($err, qr/is not known/, "a lease from before the crash is refused");
my $done = 0;
for (1 .. 50)
{
	my $n = as('alice', q{
		WITH c AS (SELECT lease FROM dwarf.claim('pay', 100, NULL, '2 s'))
		SELECT count(dwarf.complete(lease, '{"answer": "again"}')) FROM c});
	$done += $n;
	last if $done >= $waiting;
}
is($done, $waiting, 'every leased step is offered again after the crash');
for my $i (@ids)
{
	like(outcome($i), qr/^completed\|.*"finished": "again"/, "flow $i completes after the crash");
}
is(as('alice', q{SELECT count(*) FROM dwarf.step WHERE task = 'charge' AND status = 'completed'
	GROUP BY flow_id HAVING count(*) > 1}), '', 'no step completed twice');

# ------------------------------------------------------------------ 8. the README's workers
my $readme = slurp_file("$FindBin::Bin/../README.md");
$readme =~ /## Work outside the database(.*?)\n## /s or die 'no README section';
my $section = $1;
my ($sql_worker) = grep { /CREATE PROCEDURE shop\.summarize_worker/ } ($section =~ /```sql\n(.*?)```/sg);
defined $sql_worker or die 'no SQL worker in the README';
$sql_worker =~ s/^SELECT .*:id.*$//mg;    # the README's look at its own flow, by a psql variable
my ($sh_worker)  = $section =~ /```sh\n(.*?)```/s;
as('postgres', q{
CREATE SCHEMA shop;
CREATE TABLE shop.summaries (flow_id bigint, body text);
SELECT dwarf.define('summaries', '{"tasks": {"Summarize": {"external": "llm", "lease": "2 min"}}}');
SELECT count(dwarf.create('summaries', jsonb_build_object('text', 'text number ' || g)))
  FROM generate_series(1, 3) g;
});
$sql_worker =~ /CALL shop\.summarize_worker\(rounds => 1\);/ or die 'no CALL';
as('postgres', $sql_worker);
is(as('postgres', q{SELECT count(*) FROM shop.summaries}), '3', "the README's SQL worker wrote its rows");
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	WHERE g.name = 'summaries' AND f.status = 'completed' AND f.state->>'summary' LIKE 'text number %'}, '3'),
	"the README's SQL worker completed the steps with its changes");

my $bin = PostgreSQL::Test::Utils::tempdir;
open my $fh, '>', "$bin/summarize" or die;
print $fh "#!/bin/sh\ntr a-z A-Z\n";
close $fh;
chmod 0755, "$bin/summarize";
as('postgres', q{SELECT count(dwarf.create('summaries', jsonb_build_object('text', 'shell ' || g)))
  FROM generate_series(1, 2) g});
$sh_worker =~ s/^while :; do/for round in 1 2; do/ or die 'no loop';
$sh_worker =~ s/wait => '30 s'/wait => '5 s'/;
{
	local $ENV{PATH}       = "$bin:$ENV{PATH}";
	local $ENV{PGHOST}     = $node->host;
	local $ENV{PGPORT}     = $node->port;
	local $ENV{PGDATABASE} = 'postgres';
	my ($stdout, $stderr);
	IPC::Run::run([ 'bash', '-c', $sh_worker ], '>', \$stdout, '2>', \$stderr);
	is($stderr, '', "the README's shell worker runs without errors");
}
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	WHERE g.name = 'summaries' AND f.status = 'completed' AND f.state->>'summary' LIKE '%SHELL %'}, '2'),
	"the README's shell worker completed the steps with the program's output");

# ------------------------------------------------------------------ 9. limits
as('alice', q{
SELECT dwarf.set_limit('model', concurrency => 2);
SELECT dwarf.set_limit('per_customer', concurrency => 1);
SELECT dwarf.define('limited', '{"tasks": {
	"M": {"external": "model", "lease": "1 min", "limit": "model"},
	"C": {"external": "cust", "lease": "2 s", "limit": {"name": "per_customer", "key": "$.customer"}}},
  "transitions": [{"from": "M", "to": "C"}]}');
SELECT count(dwarf.create('limited', jsonb_build_object('customer', 'c' || (g % 2)))) FROM generate_series(1, 5) g;
});
my $first = as('alice', q{SELECT string_agg(lease::text, ' ') FROM dwarf.claim('model', 10, NULL, '5 s')});
my @model = split / /, $first;
is(scalar(@model), 2, 'a claim of 10 takes 2 steps under a limit of concurrency 2');
is(as('alice', q{SELECT count(*) FROM dwarf.claim('model', 10)}), '0', 'no more while both are held');
as('alice', qq{SELECT dwarf.complete($model[0], '{}')});
my @more = split / /, as('alice', q{SELECT string_agg(lease::text, ' ') FROM dwarf.claim('model', 10, NULL, '5 s')});
is(scalar(@more), 1, 'a completed step gives its place back: one more is claimed');
as('alice', qq{SELECT dwarf.complete($model[1], '{}')});
my @waited = split / /, as('alice', q{SELECT string_agg(lease::text, ' ') FROM dwarf.claim('model', 10, NULL, '5 s')});
is(scalar(@waited), 1, 'a waiting claim takes the step whose place came back');
as('alice', qq{SELECT dwarf.complete($_, '{}')}) for (@more, @waited);

# Per key: customers c0 and c1 each get one step in progress.  The other
# three steps of task M are done first, so that all five flows wait at C
# (two of customer c0, three of c1).
as('alice', q{SELECT count(dwarf.complete(lease, '{}')) FROM dwarf.claim('model', 1, NULL, '5 s')});
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.external_steps('cust')}, '5'),
	'five steps of task C wait');
my $cust = as('alice', q{SELECT string_agg(input->>'customer', ',' ORDER BY input->>'customer')
	FROM dwarf.claim('cust', 10, NULL, '5 s')});
is($cust, 'c0,c1', 'one step per customer key is claimed, not two of one customer');
# The leases run out (2 s): their places are given back, and the steps
# are claimed again.
my $again = as('alice', q{SELECT string_agg(input->>'customer', ',' ORDER BY input->>'customer')
	FROM dwarf.claim('cust', 10, NULL, '20 s')});
like($again, qr/c/, 'a lease that ran out gives its place back');

# ------------------------------------------------------------------ 10. a crash after answers
as('alice', q{SELECT count(dwarf.create('pay', jsonb_build_object('amount', 200 + g))) FROM generate_series(1, 20) g});
my $answered = 0;
for (1 .. 20)
{
	$answered += as('alice', q{SELECT count(dwarf.complete(lease, jsonb_build_object('answer', 'x' || (input->>'amount'))))
		FROM dwarf.claim('pay', 20, NULL, '2 s')});
	last if $answered >= 20;
}
is($answered, 20, 'twenty steps answered');
$node->stop('immediate');
$node->start;
wait_for_workers($node, 'the workers run again after the crash');
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.flow WHERE status = 'running' AND (input->>'amount')::int > 200}, '0'),
	'the answered flows complete after the crash');
is(as('alice', q{SELECT count(*) FROM dwarf.flow WHERE (input->>'amount')::int > 200
	AND status = 'completed' AND state->>'finished' = 'x' || (input->>'amount')}), '20',
	'each with the changes of its answer');
is(as('alice', q{SELECT count(*) FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
	WHERE (f.input->>'amount')::int > 200 AND s.task = 'charge'}), '20',
	'each answered step is recorded once');
is(as('postgres', q{SELECT count(*) FROM dwarf.answer}), '0', 'no answer is left behind');

check_no_crash($node, 'no process crashed');
stop_node($node, $t0);
done_testing();
