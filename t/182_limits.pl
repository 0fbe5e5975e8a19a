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
#  4. privileges: a limit belongs to the role that set it first; another
#     role can neither change nor drop it (and says whose it is), its owner
#     and a superuser can;
#  5. a task that names a limit no one set is not limited;
#  6. after a crash of the server, the counts start from zero.
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

# ---------------------------------------------------------------- 4. privileges
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.set_limit('api', concurrency => 50)},
	extra_params => [ '-U', 'bob' ]);
isnt($rc, 0, "bob cannot change alice's limit");
like($err, qr/limit "api" belongs to role alice/, 'the error says whose limit it is');
($rc, $out, $err) = $node->psql('postgres', q{SELECT dwarf.drop_limit('api')},
	extra_params => [ '-U', 'bob' ]);
like($err, qr/limit "api" belongs to role alice/, "bob cannot drop alice's limit");
($rc, $out, $err) = $node->psql('postgres', q{UPDATE dwarf.limit SET concurrency = 50},
	extra_params => [ '-U', 'bob' ]);
like($err, qr/permission denied/, 'nor write dwarf.limit directly');
is(query(q{SELECT concurrency FROM dwarf.limit WHERE name = 'api'}), '2',
	'the limit is unchanged');
alice(q{SELECT dwarf.set_limit('api', concurrency => 3, rate => 100, per => '1 min')});
is(query(q{SELECT concurrency, rate, per, owner FROM dwarf.limit WHERE name = 'api'}),
	'3|100|00:01:00|alice', 'its owner can change it');
query(q{SELECT dwarf.set_limit('api', concurrency => 4)});
is(query(q{SELECT concurrency, owner FROM dwarf.limit WHERE name = 'api'}),
	'4|alice', 'a superuser can change it; it stays its owner\'s');
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
stop_node($node, $t0);
done_testing();
