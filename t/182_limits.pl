# Copyright: dwarf project.
#
# 182_limits.pl: named limits (dwarf.set_limit) bound the steps of the tasks
# that name them, across workers and runners:
#
#  1. concurrency 2: ten flows of a 0.3 s task (slow: its steps go to
#     runners) never have more than two steps running at once, as the
#     intervals the task records show; once they are done, nothing is
#     counted in progress any more;
#  2. rate 20 per second: sixty quick flows created at once start no more
#     than the rate (plus its 5%, plus a margin for a loaded machine) in any
#     second, and take about three seconds in all;
#  3. a key: with {"name": ..., "key": "$.customer"} and concurrency 1, each
#     customer has its own count: one step of each runs at a time, and the
#     two customers' steps run side by side;
#  4. names per owner: a limit belongs to the role that set it, and its
#     name is that role's: another role's set_limit and drop_limit of the
#     same name act on a limit of its own (concurrency 0 there stops none of
#     the first role's steps); role.name reaches another role's limit only
#     with its privileges, in set_limit, drop_limit and a graph alike; a
#     role sees only its own limits and counts (keys come from inputs);
#     a superuser changes any as role.name;
#  5. a task that names a limit no one set is not limited;
#  6. after a crash of the server, the counts start from zero;
#  7. the counts are shared by role: with dwarf.max_limit_keys = 16, bob's
#     twenty keys in progress (leased external steps) hold at most half of
#     them, and alice's keyed steps still find counts and run while his
#     wait; the log says so once in a while, not once a step;
#  8. several limits on one task ("limit": [...]): a step starts only with a
#     place of each (one step per customer and two in all, side by side),
#     for a function task and an external task's claim alike; the graph
#     says which are wrong (more than four, one named twice, none).
#
# The tasks record when they started and ended in public.ran; some wait at
# a gate (a row the test opens) so that the test sees them in progress.
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
my $node = new_node('limits');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice, bob;
CREATE TABLE gate (open bool NOT NULL);
INSERT INTO gate VALUES (true);
GRANT SELECT ON gate TO PUBLIC;
CREATE TABLE ran (test text, flow_id bigint, customer text,
                  started timestamptz, ended timestamptz);
GRANT INSERT ON ran TO PUBLIC;
-- Sleeps "sleep" seconds, waits for the gate to be open, and records when
-- it ran (rolled back with its step if the step is).
CREATE FUNCTION app.slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz := clock_timestamp();
BEGIN
	PERFORM pg_sleep(coalesce((s->>'sleep')::float8, 0));
	WHILE NOT (SELECT open FROM public.gate) LOOP
		PERFORM pg_sleep(0.02);
	END LOOP;
	INSERT INTO public.ran VALUES (s->>'test', dwarf.flow_id(), s->>'customer', t0, clock_timestamp());
	RETURN '{}';
END $$;
CREATE FUNCTION app.quick(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.ran VALUES (s->>'test', dwarf.flow_id(), NULL, clock_timestamp(), clock_timestamp());
	RETURN '{}';
END $$;
});

# Runs SQL as alice, and returns its output.  An error is shown, not fatal:
# the checks that follow then fail, each saying what did not happen.
sub alice
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql, extra_params => [ '-U', 'alice' ]);
	diag $err if $rc != 0;
	return $out;
}

# Runs SQL as the superuser, and returns its output (an error shown, as above).
sub query
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql);
	diag $err if $rc != 0;
	return $out;
}
wait_for_workers($node, 'two workers run');

# The most steps of a test that ran at once, from the recorded intervals:
# at each start, how many had started and not ended.
sub max_overlap
{
	my ($test, $extra) = @_;
	$extra //= '';
	return query(qq{
		SELECT coalesce(max(n), 0) FROM (
			SELECT (SELECT count(*) FROM ran r2
			         WHERE r2.test = r1.test $extra AND r2.started <= r1.started
			           AND r2.ended > r1.started) n
			  FROM ran r1 WHERE r1.test = '$test') x});
}

# ---------------------------------------------------------------- 1. concurrency
alice(q{SELECT dwarf.define('conc', '{"tasks": {"W": {"function": "app.slow", "limit": "api"}}}')});
alice(q{SELECT dwarf.set_limit('api', concurrency => 2)});
is(query(q{SELECT concurrency, rate, per, owner FROM dwarf.limit WHERE name = 'api'}),
	'2||00:00:01|alice', 'the limit is a row of dwarf.limit, owned by the role that set it');
alice(q{SELECT dwarf.create('conc', '{"test": "conc", "sleep": 0.3}') FROM generate_series(1, 10)});
wait_flows_closed($node, 'postgres', 'the ten flows under concurrency 2 close');
is(query(
		q{SELECT count(*) FILTER (WHERE status = 'completed') FROM dwarf.flow f
		    JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'conc'}),
	'10', 'all ten completed');
is(query(q{SELECT count(*) FROM ran WHERE test = 'conc'}), '10',
	'each step ran (and committed) once');
my $overlap = max_overlap('conc');
cmp_ok($overlap, '<=', 2, "never more than two steps ran at once (at most $overlap did)");
is(query(
		q{SELECT coalesce(sum(in_progress), 0) FROM dwarf.limits WHERE name = 'api'}),
	'0', 'with the steps done, none is counted in progress');

# ---------------------------------------------------------------- 2. rate
alice(q{SELECT dwarf.define('rated', '{"tasks": {"Q": {"function": "app.quick", "limit": "quick"}}}')});
alice(q{SELECT dwarf.set_limit('quick', rate => 20, per => '1 s')});
alice(q{SELECT dwarf.create('rated', '{"test": "rated"}') FROM generate_series(1, 60)});
wait_flows_closed($node, 'postgres', 'the sixty flows under rate 20 per second close');
is(query(q{SELECT count(*) FROM ran WHERE test = 'rated'}), '60',
	'each of the sixty steps ran once');
# Any second holds at most 21 starts (the rate and its 5%); 3 more for the
# time between a worker's take and the task's clock on a loaded machine.
my $busiest = query(q{
	SELECT max((SELECT count(*) FROM ran r2 WHERE r2.test = 'rated'
	             AND r2.started >= r1.started AND r2.started < r1.started + interval '1 s'))
	  FROM ran r1 WHERE r1.test = 'rated'});
cmp_ok($busiest, '<=', 24, "no second saw more starts than the rate allows ($busiest)");
my $span = query(q{
	SELECT extract(epoch FROM max(started) - min(started)) FROM ran WHERE test = 'rated'});
note sprintf('60 starts over %.2f s: %.1f per second after the first', $span, 59 / $span) if $span;
cmp_ok($span, '>=', 2.5, 'sixty starts at 20 per second took about three seconds');

# ---------------------------------------------------------------- 3. per key
alice(q{SELECT dwarf.define('keyed', '{"tasks": {"K": {"function": "app.slow",
	"limit": {"name": "per_customer", "key": "$.customer"}}}}')});
alice(q{SELECT dwarf.set_limit('per_customer', concurrency => 1)});
$node->safe_psql('postgres', q{UPDATE gate SET open = false});
alice(q{SELECT dwarf.create('keyed', jsonb_build_object('test', 'keyed', 'customer', c))
          FROM generate_series(1, 3), unnest(ARRAY['a', 'b']) c});
ok($node->poll_query_until('postgres',
		q{SELECT string_agg(key || '=' || in_progress, ' ' ORDER BY key)
		    FROM dwarf.limits WHERE name = 'per_customer' AND in_progress > 0},
		'a=1 b=1'),
	'each customer has one step in progress, under a count of its own');
$node->safe_psql('postgres', q{UPDATE gate SET open = true});
wait_flows_closed($node, 'postgres', 'the keyed flows close');
is(query(q{SELECT count(*) FROM ran WHERE test = 'keyed'}), '6',
	'each of the six steps ran once');
is(max_overlap('keyed', 'AND r2.customer = r1.customer'), '1',
	'one step of a customer ran at a time');
cmp_ok(query(q{
		SELECT count(*) FROM ran a JOIN ran b ON a.started < b.ended AND b.started < a.ended
		 WHERE a.test = 'keyed' AND b.test = 'keyed' AND a.customer = 'a' AND b.customer = 'b'}), '>', 0,
	"the two customers' steps ran side by side");

# ---------------------------------------------------------------- 4. names per owner
# Runs SQL as bob: (status, output, error).
sub bob
{
	my ($sql) = @_;
	return $node->psql('postgres', $sql, extra_params => [ '-U', 'bob' ]);
}
my ($rc, $out, $err) = bob(q{SELECT dwarf.set_limit('api', concurrency => 0)});
is($rc, 0, "bob's set_limit of alice's name sets a limit of bob's own");
is(query(q{SELECT owner, concurrency FROM dwarf.limit WHERE name = 'api' ORDER BY owner::text}),
	"alice|2\nbob|0", 'two limits named api, one each');
$node->safe_psql('postgres', q{TRUNCATE ran});
alice(q{SELECT dwarf.create('conc', '{"test": "conc_after_bob", "sleep": 0.05}') FROM generate_series(1, 4)});
wait_flows_closed($node, 'postgres', "alice's flows close under her own limit, bob's concurrency 0 aside");
is(query(q{SELECT count(*) FROM ran WHERE test = 'conc_after_bob'}), '4', "all four of alice's steps ran");
is((bob(q{SELECT count(*) FROM dwarf.limit}))[1], '1', 'bob sees only his own limit');
is((bob(q{SELECT string_agg(owner::text, ',') FROM dwarf.limits}))[1], 'bob', 'and only it in dwarf.limits');
($rc, $out, $err) = bob(q{SELECT dwarf.set_limit('alice.api', concurrency => 50)});
isnt($rc, 0, "bob cannot set alice's limit by naming it alice.api");
like($err, qr/role bob may not use limit "api" of role alice/, 'the error says whose limit it is');
like($err, qr/GRANT alice TO bob/, 'and how to be allowed');
($rc, $out, $err) = bob(q{SELECT dwarf.drop_limit('alice.api')});
like($err, qr/role bob may not use limit "api" of role alice/, "nor drop it");
($rc, $out, $err) = bob(q{SELECT dwarf.define('borrow', '{"tasks": {"B": {"function": "app.quick", "limit": "alice.api"}}}')});
like($err, qr/role bob may not use limit "api" of role alice/, "nor name it in a graph");
($rc, $out, $err) = bob(q{UPDATE dwarf.limit SET concurrency = 50});
like($err, qr/permission denied/, 'nor write dwarf.limit directly');
($rc, $out) = bob(q{SELECT dwarf.drop_limit('api'), dwarf.drop_limit('api')});
is($out, 't|f', 'bob drops his own');
is(query(q{SELECT owner, concurrency FROM dwarf.limit WHERE name = 'api'}), 'alice|2',
	"alice's limit is unchanged");
alice(q{SELECT dwarf.set_limit('api', concurrency => 3, rate => 100, per => '1 min')});
is(query(q{SELECT concurrency, rate, per, owner FROM dwarf.limit WHERE name = 'api'}),
	'3|100|00:01:00|alice', 'its owner can change it');
query(q{SELECT dwarf.set_limit('alice.api', concurrency => 4)});
is(query(q{SELECT concurrency, owner FROM dwarf.limit WHERE name = 'api'}),
	'4|alice', 'a superuser changes it as alice.api; it stays its owner\'s');
# With alice's privileges, bob uses her limit: his graph names alice.api.
$node->safe_psql('postgres', q{GRANT alice TO bob});
($rc, $out, $err) = bob(q{SELECT dwarf.define('borrow', '{"tasks": {"B": {"function": "app.slow", "limit": "alice.api"}}}')});
is($rc, 0, "granted alice, bob's graph may name alice.api");
$node->safe_psql('postgres', q{UPDATE gate SET open = false});
bob(q{SELECT dwarf.create('borrow', '{"test": "borrow"}')});
ok($node->poll_query_until('postgres',
		q{SELECT sum(in_progress) FROM dwarf.limits WHERE owner = 'alice'::regrole AND name = 'api'}, '1'),
	"bob's step is counted under alice's limit");
$node->safe_psql('postgres', q{UPDATE gate SET open = true});
wait_flows_closed($node, 'postgres', "bob's flow closes");
$node->safe_psql('postgres', q{REVOKE alice FROM bob});
is(alice(q{SELECT dwarf.drop_limit('api'), dwarf.drop_limit('api')}),
	't|f', 'its owner can drop it');
is(query(
		q{SELECT 'dwarf.limit'::regclass = ANY (extconfig) FROM pg_extension WHERE extname = 'dwarf'}),
	't', 'pg_dump dumps the limits');

# ---------------------------------------------------------------- 5. not set
alice(q{SELECT dwarf.define('unset', '{"tasks": {"U": {"function": "app.slow", "limit": "nobody_set_this"}}}')});
$node->safe_psql('postgres', q{UPDATE gate SET open = false});
alice(q{SELECT dwarf.create('unset', '{"test": "unset"}') FROM generate_series(1, 4)});
ok($node->poll_query_until('postgres',
		q{SELECT in_progress FROM dwarf.limit_counts() WHERE name = 'nobody_set_this'}, '4'),
	'four steps of a task whose limit is not set run at once');
$node->safe_psql('postgres', q{UPDATE gate SET open = true});
wait_flows_closed($node, 'postgres', 'they close');
is(query(q{SELECT count(*) FROM ran WHERE test = 'unset'}), '4',
	'each ran once');

# ---------------------------------------------------------------- definitions
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT dwarf.define('bad', '{"tasks": {"T": {"function": "app.quick", "limit": {"key": "$.x"}}}}')});
like($err, qr/the limit of task "T" has no "name"/, 'a limit object needs a name');
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT dwarf.define('bad', '{"tasks": {"T": {"function": "app.quick", "limit": {"name": "x", "key": "$.["}}}}')});
like($err, qr/bad path "\$\.\[" in the limit key of task "T"/, 'a bad key path is refused');

($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.set_limit('x', concurrency => -1)});
like($err, qr/concurrency must not be negative/, 'a negative concurrency is refused');
($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.set_limit('x', rate => 0)});
like($err, qr/rate must be at least 1/, 'a rate below 1 is refused');
($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.set_limit(repeat('x', 64), 1)});
like($err, qr/cannot name a limit/, 'a name of 64 bytes is refused');
check_no_crash($node, 'no crash');

# ---------------------------------------------------------------- 6. a crash
# Two steps hold the limit's places when a runner dies and the server
# restarts: the counts start again from zero, and the steps that run again
# take the places anew (were the old ones kept, none could start).
alice(q{SELECT dwarf.define('crash', '{"tasks": {"C": {"function": "app.slow", "limit": "crashy"}}}')});
alice(q{SELECT dwarf.set_limit('crashy', concurrency => 2)});
$node->safe_psql('postgres', q{UPDATE gate SET open = false});
alice(q{SELECT dwarf.create('crash', '{"test": "crash"}') FROM generate_series(1, 4)});
ok($node->poll_query_until('postgres',
		q{SELECT in_progress FROM dwarf.limits WHERE name = 'crashy'}, '2'),
	'two steps hold the limit');
# (in runners: a step that has not run past dwarf.long_step yet is still in
# a worker on a loaded machine)
ok($node->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'dwarf runner'}, 't'),
	'a runner runs a step of the limit');
my $runner = query(q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf runner' LIMIT 1});
my $workers = query(q{SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type = 'dwarf worker'});
ok($runner && kill('KILL', $runner), 'a runner is killed');
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) FROM pg_stat_activity
		    WHERE backend_type = 'dwarf worker' AND pid NOT IN ($workers)}, '2'),
	'the server restarted: two new workers run');
ok($node->poll_query_until('postgres',
		q{SELECT in_progress FROM dwarf.limits WHERE name = 'crashy'}, '2'),
	'after the restart, two steps hold the limit again: they run again, under fresh counts');
$node->safe_psql('postgres', q{UPDATE gate SET open = true});
wait_flows_closed($node, 'postgres', 'the flows close after the restart');
is(query(q{SELECT count(*) FROM ran WHERE test = 'crash'}), '4', 'each of the four ran once');
cmp_ok(max_overlap('crash'), '<=', 2, 'never more than two at once');

# ---------------------------------------------------------------- 7. counts shared by role
# Bob's external steps hold their counts while leased (no process does):
# he claims twenty, each under a key of its own, more than the counts there
# are (all of which he took before counts were shared by role).
$node->append_conf('postgresql.conf', 'dwarf.max_limit_keys = 16');
$node->restart;
wait_for_workers($node, 'two workers run after the restart');
$node->safe_psql('postgres', q{CREATE TABLE leases (lease bigint); GRANT SELECT, INSERT, DELETE ON leases TO bob});
bob(q{SELECT dwarf.define('hog', '{"tasks": {"H": {"external": "hog",
	"limit": {"name": "per_customer", "key": "$.customer"}}}}')});
bob(q{SELECT dwarf.set_limit('per_customer', concurrency => 1)});
alice(q{SELECT dwarf.define('keyedq', '{"tasks": {"K": {"function": "app.quick",
	"limit": {"name": "per_customer", "key": "$.customer"}}}}')});
bob(q{SELECT dwarf.create('hog', jsonb_build_object('customer', 'c' || i)) FROM generate_series(1, 20) i});
ok($node->poll_query_until('postgres',
		q{SELECT count(*) FROM dwarf.external_steps('hog') WHERE state = 'ready'}, '20'),
	"bob's twenty external steps are offered");
my $log_at = -s $node->logfile;
($rc, $out, $err) = bob(q{WITH c AS (INSERT INTO leases SELECT lease FROM dwarf.claim('hog', 20, lease => '5 min')
                                     RETURNING lease)
                          SELECT count(*) FROM c});
is($out, '8', "bob's claim of twenty gets eight: his keys take half of the sixteen counts");
alice(q{SELECT dwarf.create('keyedq', jsonb_build_object('test', 'keyedq', 'customer', c))
          FROM unnest(ARRAY['a', 'b']) c});
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM ran WHERE test = 'keyedq'}, '2'),
	"alice's two keyed steps find counts and run while bob's twelve wait");
($rc, $out, $err) = bob(q{SELECT count(*) FROM dwarf.claim('hog', 20, lease => '5 min')});
is($out, '0', 'bob, over his share now that alice holds counts too, gets no more');
is(query(q{SELECT count(*) FROM dwarf.limit_counts() WHERE owner = 'bob'::regrole}), '8',
	'bob holds eight counts');
is((bob(q{SELECT count(*) FROM dwarf.limit_counts() WHERE owner = 'alice'::regrole}))[1], '0',
	"bob sees none of alice's keys");
my $said = () = slurp_file($node->logfile, $log_at) =~ /holds its share of dwarf\.max_limit_keys/g;
cmp_ok($said, '>=', 1, 'the log says why his steps wait');
cmp_ok($said, '<=', 2, "once in a while, not once a step ($said lines)");
($rc, $out, $err) = bob(q{WITH c AS (DELETE FROM leases RETURNING lease) SELECT count(dwarf.complete(lease)) FROM c});
is($out, '8', 'bob completes his eight');
my @rounds;
for (1 .. 2)
{
	($rc, $out, $err) = bob(q{SELECT count(dwarf.complete(lease)) FROM dwarf.claim('hog', 20, lease => '5 min')});
	push @rounds, $out;
}
is(join(',', @rounds), '8,4', 'and, his counts given back, claims and completes the other twelve, eight at a time');
wait_flows_closed($node, 'postgres', "bob's flows close");
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.limit_counts()}, '0'),
	'with nothing in progress, no count is kept');
# ---------------------------------------------------------------- 8. several limits
alice(q{SELECT dwarf.set_limit('one_each', concurrency => 1)});
alice(q{SELECT dwarf.set_limit('two_in_all', concurrency => 2)});
alice(q{SELECT dwarf.define('both', '{"tasks": {"B": {"function": "app.slow",
	"limit": [{"name": "one_each", "key": "$.customer"}, "two_in_all"]}}}')});
$node->safe_psql('postgres', q{TRUNCATE ran});
alice(q{SELECT dwarf.create('both', jsonb_build_object('test', 'both', 'customer', c, 'sleep', 0.2))
          FROM generate_series(1, 2), unnest(ARRAY['a', 'b', 'c']) c});
wait_flows_closed($node, 'postgres', 'the flows under two limits close');
is(query(q{SELECT count(*) FROM ran WHERE test = 'both'}), '6', 'each of the six steps ran once');
is(max_overlap('both', 'AND r2.customer = r1.customer'), '1', 'one step of a customer ran at a time');
cmp_ok(max_overlap('both'), '<=', 2, 'and never more than two in all');
cmp_ok(max_overlap('both'), '>=', 2, 'two of different customers ran side by side');
alice(q{SELECT dwarf.define('both_outside', '{"tasks": {"O": {"external": "both",
	"limit": [{"name": "one_each", "key": "$.customer"}, "two_in_all"]}}}')});
alice(q{SELECT dwarf.create('both_outside', jsonb_build_object('customer', c))
          FROM unnest(ARRAY['a', 'a', 'b', 'c']) c});
ok($node->poll_query_until('postgres',
		q{SELECT count(*) FROM dwarf.external_steps('both') WHERE state = 'ready'}, '4'),
	'four external steps under two limits are offered');
is(query(q{SELECT count(*), count(DISTINCT input ->> 'customer')
             FROM dwarf.claim('both', 4, lease => '1 min')}), '2|2',
	'a claim of four gets two, of two customers: one each, two in all');
is(query(q{SELECT sum(in_progress) FROM dwarf.limits WHERE name IN ('one_each', 'two_in_all')}), '4',
	'each claimed step holds a place of both limits');
$node->safe_psql('postgres', q{SELECT dwarf.cancel(id) FROM dwarf.flow WHERE status = 'running'});
ok($node->poll_query_until('postgres',
		q{SELECT coalesce(sum(in_progress), 0) FROM dwarf.limits WHERE name IN ('one_each', 'two_in_all')}, '0'),
	'cancelled, the leases give back both places');
for my $bad (
	[ q{["l1", "l2", "l3", "l4", "l5"]}, qr/task "T" names more than 4 limits/, 'more than four limits' ],
	[ q{["l1", {"name": "l1", "key": "$.x"}]}, qr/task "T" names limit "l1" twice/, 'a limit named twice' ],
	[ q{[]}, qr/is an empty array/, 'an empty list of limits' ])
{
	($rc, $out, $err) = $node->psql('postgres',
		qq{SELECT dwarf.define('bad', '{"tasks": {"T": {"function": "app.quick", "limit": $bad->[0]}}}')});
	like($err, $bad->[1], "$bad->[2] is refused");
}
stop_node($node, $t0);
done_testing();
