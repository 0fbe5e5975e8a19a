# Copyright: dwarf project.
#
# 100_router.pl: dwarf on two shards behind a dwarf_router database.
#
# Two shard servers preload dwarf with dwarf.shard_id 0 and 1; a third
# server, the router, has PL/Proxy and dwarf_router, with the two shards as
# the partitions of foreign server dwarf_shards.  Everything below goes
# through the router, and the shards are only read directly to check it:
#
#  - graphs defined through the router are on both shards at the same
#    version, and a graph one shard lacks is copied to it by the next define;
#    a graph name is its owner's: another role's define of the same name
#    makes its own graph, which its runs run, and sync_graphs levels each;
#  - a few hundred flows created and run through the router (with and
#    without idempotency keys) are spread over both shards, each on the shard
#    its id names, and each ran every task exactly once there;
#  - every routed call does on the flow's shard what it does on one server:
#    await, snapshot, history and step (whose step ids carry the shard, as
#    on the shard itself),
#    state_at, fork, continue, cancel, resume of an interrupted flow, delete,
#    history_mermaid; list pages through the flows of both shards with its
#    cursor; stats, worker_stats, purge and maintain combine both shards;
#  - with shard 1 stopped, calls routed to it fail with 08006 "dwarf shard 1
#    is unreachable", and calls routed to shard 0 go on working (creates
#    without a key land there); once shard 1 is back, its calls work again.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $NPLAIN = 200;    # flows created without an idempotency key
my $NKEYED = 40;     # created with one (and created again: same ids)
my $NRUN   = 20;     # dwarf.run, with a key

my $t0 = time;

# ---------------------------------------------------------------------------
# Two shards and a router.

my @shards;
for my $i (0, 1)
{
	my $shard = new_node("shard$i", 'dwarf.shard_id' => $i);
	# The task functions of DwarfTest's graph "g", and "app.ask", which
	# parks its flow on dwarf.interrupt until it is resumed.
	$shard->safe_psql('postgres', "CREATE EXTENSION dwarf;\n" . tasks_sql() . q{
CREATE FUNCTION app.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE answer jsonb := dwarf.interrupt('{"ask": "ok?"}');
BEGIN
	IF answer IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('answer', answer);
END $$;
CREATE FUNCTION app.decline(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'declined' USING ERRCODE = '22023', HINT = 'Try another card.';
END $$;
});
	push @shards, $shard;
}
wait_for_workers($_, 'the shard\'s dwarf workers run') for @shards;

my $router = PostgreSQL::Test::Cluster->new('router');
$router->init;
$router->start;
my $partitions = join(', ',
	map { sprintf("p%d 'host=%s port=%d dbname=postgres'", $_, $shards[$_]->host, $shards[$_]->port) }
	  (0, 1));
$router->safe_psql('postgres', qq{
CREATE EXTENSION plproxy;
CREATE EXTENSION dwarf_router;
CREATE SERVER dwarf_shards FOREIGN DATA WRAPPER plproxy OPTIONS ($partitions);
CREATE USER MAPPING FOR PUBLIC SERVER dwarf_shards;
});

# r($sql): the router's answer; r_err($sql): psql's stderr (verbose, so
# that it shows the SQLSTATE), for a statement expected to fail.
sub r { return $router->safe_psql('postgres', $_[0]); }

sub r_err
{
	my ($rc, $out, $err) = $router->psql('postgres', "\\set VERBOSITY verbose\n$_[0]");
	return $rc == 0 ? "(no error; got: $out)" : $err;
}

# On both shards, the same query's answers joined by "|".
sub both
{
	my ($sql) = @_;
	return join('|', map { $_->safe_psql('postgres', $sql) } @shards);
}

# The sum of a query's answers (a number) on both shards.
sub sum_shards
{
	my ($sql) = @_;
	my $sum = 0;
	$sum += $_->safe_psql('postgres', $sql) for @shards;
	return $sum;
}

is(r('SELECT string_agg(partition || ok::text, \' \' ORDER BY partition) FROM dwarf_router.shards()'),
	'0true 1true', 'dwarf_router.shards(): each partition answers as the dwarf shard of its number');

# ---------------------------------------------------------------------------
# Graphs.

my $ask_def = '{"tasks": {"Ask": "app.ask", "Done": "app.c3"}, "transitions": [{"chain": ["Ask", "Done", "END"]}]}';
is(r(graph_sql()), '1', 'define through the router returns version 1');
is(r("SELECT dwarf.define('ask', '$ask_def')"), '1', 'a second graph: version 1');
is(both("SELECT string_agg(name || version, ',' ORDER BY name, version) FROM dwarf.graph"),
	'ask1,g1|ask1,g1', 'both shards have both graphs at version 1');
is(r("SELECT dwarf.validate('$ask_def') ->> 'entry'"), 'Ask',
	'validate returns the normalized definition (its entry filled in)');
like(r_err(q{SELECT dwarf.validate('{"tasks": {"A": "app.missing"}}')}),
	qr/function app\.missing\(jsonb\) of task "A" does not exist.*Raised by dwarf shard 0/s,
	'validate: a shard\'s refusal comes back with its message, naming the shard');

# A version one shard lacks (as a define that failed half way leaves it):
# the next define through the router copies it over, and defines nothing
# twice when it is the same definition.
my $lone = '{"tasks": {"A": "app.a1"}}';
$shards[0]->safe_psql('postgres', "SELECT dwarf.define('lone', '$lone')");
is(r("SELECT dwarf.define('lone', '$lone')"), '1',
	'define of a graph only shard 0 has: version 1, not 2 (the retry of a half-done define)');
is(both(q{SELECT string_agg(version::text, ',') FROM dwarf.graph WHERE name = 'lone'}), '1|1',
	'... and shard 1 now has version 1 too');
is(r(q{SELECT dwarf.define('lone', '{"tasks": {"A": "app.a2"}}')}), '2',
	'the next define of another definition gives version 2 on both');
is(both(q{SELECT max(version) FROM dwarf.graph WHERE name = 'lone'}), '2|2', '... on both shards');

# A graph name is its owner's, through the router as on one server: another
# role's define of "lone" makes that role's own graph on every shard, and
# its run of "lone" runs its own; ours stays at version 2.  sync_graphs
# levels each owner's graph as that owner.
$_->safe_psql('postgres', q{
CREATE ROLE rmal LOGIN;
GRANT USAGE ON SCHEMA dwarf, app TO rmal;
GRANT INSERT ON public.done TO rmal;
}) for @shards;
$router->safe_psql('postgres', q{
CREATE ROLE rmal LOGIN;
GRANT USAGE ON FOREIGN SERVER dwarf_shards TO rmal;
GRANT USAGE ON SCHEMA dwarf TO rmal;
});
sub r_as { return $router->safe_psql('postgres', $_[1], extra_params => [ '-U', $_[0] ]); }
is(r_as('rmal', q{SELECT dwarf.define('lone', '{"tasks": {"A": "app.a3"}}')}), '1',
	'another role\'s define of the same name through the router: version 1 of its own graph');
my $lone_rows = q{SELECT string_agg(CASE WHEN owner = current_user::regrole THEN 'ours' ELSE owner::text END
	|| ' ' || version || ' ' || (definition -> 'tasks' ->> 'A'), ',' ORDER BY 1) FROM dwarf.graph WHERE name = 'lone'};
is(both($lone_rows), 'ours 1 app.a1,ours 2 app.a2,rmal 1 app.a3|ours 1 app.a1,ours 2 app.a2,rmal 1 app.a3',
	'... on both shards, beside ours');
my $rmal_run = r_as('rmal', q{SELECT flow_id || ' ' || status || ' ' || (state ->> 'trail') FROM dwarf.run('lone', '{}')});
like($rmal_run, qr/^\d+ completed a3$/, '... and its run of "lone" runs its own graph');
my $our_run = r(q{SELECT flow_id || ' ' || status || ' ' || (state ->> 'trail') FROM dwarf.run('lone', '{}')});
like($our_run, qr/^\d+ completed a2$/, 'our run of "lone" runs ours');
# (the flows and their tasks' writes go, so that the counts below are of
# the flows made there)
my @lone_ids = map { (split / /)[0] } ($rmal_run, $our_run);
r_as('rmal', "SELECT dwarf.delete($lone_ids[0])");
r("SELECT dwarf.delete($lone_ids[1])");
$_->safe_psql('postgres', "DELETE FROM public.done WHERE flow_id IN ($lone_ids[0], $lone_ids[1])") for @shards;
is(r(q{SELECT string_agg(owner || ' ' || graph || ' ' || version || ' ' || copied, ',' ORDER BY owner = current_user, graph)
	FROM dwarf_router.sync_graphs() WHERE graph = 'lone'}),
	'rmal lone 1 0,' . $router->safe_psql('postgres', 'SELECT current_user') . ' lone 2 0',
	'sync_graphs: one row per owner of "lone", each level');

# ---------------------------------------------------------------------------
# A few hundred flows through the router.

my @plain = split /\n/,
  r("SELECT dwarf.create('g', jsonb_build_object('n', i)) FROM generate_series(1, $NPLAIN) i");
is(scalar @plain, $NPLAIN, "$NPLAIN creates without a key return ids");

my $keyed_sql = "SELECT dwarf.create('g', jsonb_build_object('n', 1000 + i), idempotency_key => 'key-' || i)
                   FROM generate_series(1, $NKEYED) i ORDER BY i";
my $keyed = r($keyed_sql);
is(r($keyed_sql), $keyed, 'creates retried with the same idempotency keys return the same flow ids');
my @keyed = split /\n/, $keyed;
is(r("SELECT flow_id FROM dwarf.run('g', '{\"n\": 1001}', idempotency_key => 'key-1')"), $keyed[0],
	'a run with the key of an earlier create returns that flow');

my @run = split /\n/, r("SELECT status || ' ' || (state->>'count') || ' ' || flow_id
                           FROM generate_series(1, $NRUN) i,
                                dwarf.run('g', jsonb_build_object('n', 2000 + i),
                                          idempotency_key => 'run-' || i, timeout => '60 s')");
is(scalar(grep { /^completed $NTASKS \d+$/ } @run), $NRUN, "$NRUN runs through the router complete");
my @ids = (@plain, @keyed, map { (split / /)[2] } @run);
my $total = scalar @ids;

ok($router->poll_query_until('postgres', 'SELECT running FROM dwarf.stats', '0'),
	'no flow runs any more (dwarf.stats through the router)');
for my $i (0, 1)
{
	my $shard = $shards[$i];
	is($shard->safe_psql('postgres', "SELECT count(*) FROM dwarf.flow WHERE id >> 48 <> $i"), '0',
		"every flow on shard $i has $i in its id");
	check_flows_exactly_once($shard, 'postgres', when => "on shard $i");
}
my $on_shards = join(',', sort { $a <=> $b } split /\n/,
	join("\n", map { $_->safe_psql('postgres', 'SELECT id FROM dwarf.flow') } @shards));
is($on_shards, join(',', sort { $a <=> $b } @ids),
	"the shards hold exactly the $total flows the router returned");
my @per_shard = map { $_->safe_psql('postgres', 'SELECT count(*) FROM dwarf.flow') } @shards;
note "flows per shard: @per_shard";
ok($per_shard[0] > $total / 4 && $per_shard[1] > $total / 4, 'both shards got a fair share of the flows');

# ---------------------------------------------------------------------------
# Every call on a flow, through the router, on a flow of each shard.

for my $i (0, 1)
{
	my ($f) = grep { ($_ >> 48) == $i } @plain;
	my $where = "(a flow of shard $i)";

	is(r("SELECT status || ' ' || (state->>'count') FROM dwarf.await($f)"), "completed $NTASKS",
		"await $where");
	is(r("SELECT graph || ' ' || status || ' ' || steps FROM dwarf.snapshot($f)"),
		"g completed $NTASKS", "snapshot $where");
	is( r("SELECT string_agg(task, ',' ORDER BY step_id) || ' ' || bool_and(step_id >> 48 = $i)
	         FROM dwarf.history($f)"),
		"a1,a2,a3,b1,b2,b3,j,c1,c2,c3 true", "history $where: its steps, their ids carrying the shard");
	is($shards[$i]->safe_psql('postgres',
			"SELECT string_agg(step_id::text, ',' ORDER BY step_id) FROM dwarf.history($f)"),
		r("SELECT string_agg(step_id::text, ',' ORDER BY step_id) FROM dwarf.history($f)"),
		"... the same step ids as on the shard itself");
	my $c1 = r("SELECT step_id FROM dwarf.history($f) WHERE task = 'c1'");
	like($c1, qr/^\d+$/, "step $where: one step of task c1");
	is(r("SELECT dwarf.state_at($f, $c1) ->> 'count'"), '7', "state_at $where: 7 tasks before c1");
	like(r("SELECT dwarf.history_mermaid($f)"), qr/^flowchart TD.*c3<br\/>completed/s,
		"history_mermaid $where");

	my $fork = r("SELECT dwarf.fork($c1, '{\"forked\": true}')");
	is($fork >> 48, $i, "fork $where: the new flow is on the same shard");
	is(r("SELECT status || ' ' || (state->>'count') || ' ' || (state->>'forked') FROM dwarf.await($fork, '60 s')"),
		"completed $NTASKS true", "... and runs c1..c3 from the state c1 saw");

	my $next = r("SELECT dwarf.continue($f, '{\"n\": 999}')");
	is($next >> 48, $i, "continue $where: the thread's next flow is on the same shard");
	is(r("SELECT status || ' ' || (state->>'count') || ' ' || (state->>'n') FROM dwarf.await($next, '60 s')"),
		'completed 20 999', '... and runs the graph again from the final state');
	r("SELECT dwarf.delete($next)");
	like(r_err("SELECT * FROM dwarf.snapshot($next)"), qr/42704: flow $next does not exist.*Raised by dwarf shard $i/s,
		"delete $where: snapshot says the flow does not exist");
	is($shards[$i]->safe_psql('postgres', "SELECT count(*) FROM dwarf.flow WHERE id = $next"), '0',
		'... the flow is gone from its shard');
}

# cancel and resume need flows that wait: "ask" parks at its interrupt.
my @asks = split /\n/, r("SELECT dwarf.create('ask', '{}') FROM generate_series(1, 16)");
my %ask_on;
push @{ $ask_on{ $_ >> 48 } }, $_ for @asks;
for my $i (0, 1)
{
	my ($resumed, $cancelled) = @{ $ask_on{$i} || [] };
  SKIP:
	{
		skip "no ask flow landed on shard $i", 4 unless defined $cancelled;
		is(r("SELECT status || ' ' || (interrupt_payload->>'ask') FROM dwarf.await($resumed, '60 s')"),
			'interrupted ok?', "await of an interrupted flow on shard $i: its payload");
		r("SELECT dwarf.resume($resumed, '\"yes\"')");
		is(r("SELECT status || ' ' || (state->>'answer') FROM dwarf.await($resumed, '60 s')"),
			'completed yes', "resume on shard $i: the flow completes with the answer");
		r("SELECT status FROM dwarf.await($cancelled, '60 s')");
		r("SELECT dwarf.cancel($cancelled, 'no longer needed')");
		is(r("SELECT status || ' ' || cancel_reason FROM dwarf.await($cancelled)"),
			'cancelled no longer needed', "cancel on shard $i");
		like(r_err("SELECT dwarf.resume($cancelled)"),
			qr/cancelled.*Raised by dwarf shard $i/s,
			"a shard's refusal (resume of a cancelled flow) names the shard");
	}
}

# Several flows at once, over both shards, and a failure's task and SQLSTATE.
my @ten = @plain[0 .. 9];
is(r('SELECT count(*) || \' \' || bool_and(a.flow_id = i.id AND a.status = \'completed\')'
	  . ' FROM unnest(\'{' . join(',', @ten) . '}\'::bigint[]) WITH ORDINALITY i(id, n)'
	  . ' JOIN dwarf.await_all(\'{' . join(',', @ten) . '}\', \'60 s\') WITH ORDINALITY a ON a.ordinality = i.n'),
	'10 true', 'await_all through the router: one outcome per flow of either shard, in their order');
my ($still0, $still1) = ($ask_on{0}[-1], $ask_on{1}[-1]);
like(r("SELECT flow_id || ' ' || status FROM dwarf.await_any('{$still0,$still1}', '60 s')"),
	qr/^($still0|$still1) (interrupted|completed|cancelled)$/, 'await_any through the router: one of the flows, closed or parked');
is(r(q{SELECT dwarf.define('decline', '{"tasks": {"Pay": "app.decline"}}')}), '1', 'a graph that fails');
is(r(q{SELECT status || ' ' || error_task || ' ' || error_sqlstate || ' ' || error_hint FROM dwarf.run('decline', '{}')}),
	'failed Pay 22023 Try another card.', 'run through the router: the failure names its task, SQLSTATE and hint');

like(r_err('SELECT * FROM dwarf.await(' . (5 << 48) . ')'),
	qr/42704: flow \d+ does not exist\s+DETAIL:  Its id names dwarf shard 5/,
	'await of a flow id naming a shard the router does not have: a clear error');
like(r_err('SELECT dwarf.fork(' . ((5 << 48) + 12) . ')'), qr/step \d+ does not exist.*names dwarf shard 5/s,
	'fork of a step id naming a shard the router does not have: a clear error');
like(r_err("SELECT dwarf.interrupt('{}')"), qr/0A000: dwarf\.interrupt cannot be called on a dwarf router/,
	'a call that only makes sense inside a task says so on the router');

# Errors through the router, as an application sees them (psql's default
# VERBOSITY and SHOW_CONTEXT, as libpq's defaults show them): the shard's
# message and hint, and for CONTEXT at most the one line of the dwarf
# function called (its PL/pgSQL frame, which no SQL can hide: "dwarf.await",
# or "snapshot" where dwarf.snapshot is SQL over a PL/pgSQL function of that
# name), nothing of dwarf_router's internals; and the calls after an error
# print no "PL/Proxy: dropping stale conn" notice.
{
	my ($ok0) = grep { ($_ >> 48) == 0 } @plain;
	my ($ok1) = grep { ($_ >> 48) == 1 } @plain;
	my ($none0, $none1) = (999_999_999, (1 << 48) + 999_999_999);
	my @failing = (
		"SELECT * FROM dwarf.await($none0)",
		"SELECT * FROM dwarf.snapshot($none1)",
		"SELECT * FROM dwarf.history($none0)",
		"SELECT dwarf.resume($none1)",
		"SELECT dwarf.create('no_such_graph')",
		q{SELECT dwarf.validate('{"tasks": {"A": "app.missing"}}')},
		'SELECT * FROM dwarf.await(' . (5 << 48) . ')',
		"SELECT dwarf.interrupt('{}')");
	my @working = map { ("SELECT status FROM dwarf.await($ok0)", "SELECT status FROM dwarf.await($ok1)") } 1 .. 3;
	push @working, 'SELECT count(*) > 0 FROM dwarf.list()';
	my ($rc, $out, $err) = $router->psql('postgres',
		"\\set SHOW_CONTEXT errors\n" . join(";\n", (map { ($_, @working) } @failing), ''),
		on_error_stop => 0);
	$err =~ s/^psql:<stdin>:\d+: //mg;
	is(scalar(() = $err =~ /^ERROR:  /mg), scalar @failing, 'each failing call through the router: one error')
	  or diag $err;
	is($out, join("\n", map { (('completed') x 6, 't') } @failing), '... and each working call its answer');
	unlike($err, qr/dwarf_router/, 'no error names dwarf_router\'s internals');
	is(join("\n", grep { !/^(ERROR|DETAIL|HINT):  / && !/^CONTEXT:  PL\/pgSQL function (dwarf\.)?"?\w+"?\([^)]*\) line \d+ at RAISE$/ }
			split /\n/, $err),
		'', 'CONTEXT: at most one line, the dwarf function called');
	like($err, qr/^ERROR:  flow $none0 does not exist\nDETAIL:  \(Raised by dwarf shard 0\.\)\nHINT:  A role sees only its own flows[^\n]*\nCONTEXT:  PL\/pgSQL function dwarf\.await\(bigint,interval\) line \d+ at RAISE$/m,
		'a shard\'s error through the router: its message and hint, the shard in the detail, one CONTEXT line');
	unlike($err, qr/stale conn/, 'no "dropping stale conn" notice after errors');
}

# ---------------------------------------------------------------------------
# Calls over all shards.

my $all = join(',', sort { $b <=> $a } split /\n/,
	join("\n", map { $_->safe_psql('postgres', 'SELECT id FROM dwarf.flow') } @shards));
my (@paged, $before, $pages);
while (1)
{
	my $page = r('SELECT string_agg(flow_id::text, \',\' ORDER BY flow_id DESC) FROM dwarf.list(before => '
		  . ($before // 'NULL') . ', page_size => 37)');
	last if $page eq '';
	my @rows = split /,/, $page;
	push @paged, @rows;
	$before = $rows[-1];
	last if ++$pages > 100;
}
is(join(',', @paged), $all,
	'list through the router, 37 at a time with the cursor, sees every flow of both shards once, by descending id');
is(r("SELECT count(*) FROM dwarf.list(graph => 'ask', page_size => 1000)"),
	sum_shards("SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'ask'"),
	'list filters on every shard');

is(r("SELECT completed || ' ' || steps_done FROM dwarf.stats"),
	sum_shards('SELECT completed FROM dwarf.stats') . ' ' . sum_shards('SELECT steps_done FROM dwarf.stats'),
	'stats: the sums of both shards\' dwarf.stats');
is(r('SELECT count(DISTINCT pid) FROM dwarf.worker_stats()'), '4', 'worker_stats: the workers of both shards');

my $closed = sum_shards("SELECT count(*) FROM dwarf.flow WHERE status NOT IN ('running', 'interrupted')");
is(r("SELECT dwarf.purge('0 s')"), $closed, "purge: $closed closed flows deleted on both shards in all");
is(both("SELECT count(*) FROM dwarf.flow WHERE status NOT IN ('running', 'interrupted')"), '0|0',
	'... and none left on either');

SKIP:
{
	skip 'the shards have no dwarf.maintain (yet)', 1
	  unless $shards[0]->safe_psql('postgres',
		"SELECT count(*) FROM pg_proc WHERE proname = 'maintain' AND pronamespace = 'dwarf'::regnamespace")
	  eq '1';
	is(r(q{SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys(dwarf.maintain() -> 'shards') k}),
		'0,1', 'maintain runs on both shards and returns each one\'s result');
}

# ---------------------------------------------------------------------------
# Shard 1 down.

my @waiting = split /\n/, r("SELECT dwarf.create('ask', '{}') FROM generate_series(1, 16)");
my ($wait0) = grep { ($_ >> 48) == 0 } @waiting;
my ($wait1) = grep { ($_ >> 48) == 1 } @waiting;
r("SELECT status FROM dwarf.await($_, '60 s')") for ($wait0, $wait1);
my $key1 = r(q{SELECT k FROM generate_series(1, 100) i, LATERAL (SELECT 'down-' || i AS k) x
                WHERE (hashtext(k) & 2147483647) % 2 = 1 ORDER BY i LIMIT 1});
my $key0 = r(q{SELECT k FROM generate_series(1, 100) i, LATERAL (SELECT 'down-' || i AS k) x
                WHERE (hashtext(k) & 2147483647) % 2 = 0 ORDER BY i LIMIT 1});

$shards[1]->stop('fast');

like(r_err("SELECT * FROM dwarf.await($wait1)"), qr/08006: dwarf shard 1 is unreachable/,
	'with shard 1 stopped, await of one of its flows fails naming it');
like(r_err("SELECT dwarf.resume($wait1)"), qr/08006: dwarf shard 1 is unreachable/, '... resume too');
like(r_err("SELECT dwarf.create('g', '{}', idempotency_key => '$key1')"),
	qr/08006: dwarf shard 1 is unreachable/, '... and a create whose key hashes to it');
like(r_err('SELECT count(*) FROM dwarf.list()'), qr/08006: dwarf shard 1 is unreachable/,
	'... and list, which needs every shard');
is(r("SELECT status FROM dwarf.await($wait0)"), 'interrupted', 'await of a flow of shard 0 works');
r("SELECT dwarf.resume($wait0, '\"yes\"')");
is(r("SELECT status FROM dwarf.await($wait0, '60 s')"), 'completed', 'resume on shard 0 works');
like(r("SELECT dwarf.create('g', '{}', idempotency_key => '$key0')"), qr/^\d+$/,
	'a create whose key hashes to shard 0 works');
my $moved = r("SELECT string_agg(DISTINCT (dwarf.create('g', '{}') >> 48)::text, ',') FROM generate_series(1, 20)");
is($moved, '0', 'creates without a key all go to shard 0 while shard 1 is down');
is(r("SELECT string_agg(partition || ok::text, ' ' ORDER BY partition) FROM dwarf_router.shards()"),
	'0true 1false', 'dwarf_router.shards() shows partition 1 down');

$shards[1]->start;
r("SELECT dwarf.resume($wait1, '\"later\"')");
is(r("SELECT status || ' ' || (state->>'answer') FROM dwarf.await($wait1, '60 s')"), 'completed later',
	'once shard 1 is back, its flows answer through the router again');
ok($router->poll_query_until('postgres', 'SELECT running FROM dwarf.stats', '0'),
	'every flow created while shard 1 was down completes');

check_no_crash($_, 'no crash on ' . $_->name) for @shards;
$router->stop('fast');
$shards[0]->stop('fast');
stop_node($shards[1], $t0);

done_testing();
