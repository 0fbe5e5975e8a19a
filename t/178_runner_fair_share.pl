# Copyright: dwarf project.
#
# 178_runner_fair_share.pl: runners are shared fairly between roles.  With
# dwarf.max_runners = 4, alice's twelve steps of a known-slow task hold every
# runner and wait for more; bob's slow step must not wait for them:
#
#  1. bob's 0.3 s slow flow completes while alice's flows still run: one of
#     alice's runners (over her fair share, while bob's step waits) is
#     preempted, its step rolled back and given back to wait for a runner;
#  2. the preempted step is not failed, not blamed as a crash, not counted
#     as an attempt: once alice's steps may finish, each of her flows
#     completes with exactly one step row (attempt 1) and its task's write
#     there once;
#  3. with bob gone, alice's preempted step gets a runner back (she is within
#     her share: it is not preempted again);
#  4. with steps of both waiting, each holds its share (2 of 4): bob's three
#     steps take two of alice's runners, not three.
#
# alice's task waits at a gate (a row of a table) until the test opens it,
# so her steps run as long as the test needs and can then finish.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $t0   = time;
my $node = new_node('runner_fair_share', max_worker_processes => 32,
	'dwarf.max_runners' => 4, 'dwarf.long_step' => "'200ms'");

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app, dwarf TO alice, bob;
CREATE TABLE gate (who name PRIMARY KEY, open bool NOT NULL);
INSERT INTO gate VALUES ('alice', true), ('bob', true);
GRANT SELECT ON gate TO PUBLIC;
CREATE TABLE ran (flow_id bigint, who name);
GRANT INSERT ON ran TO PUBLIC;
-- Sleeps "sleep" seconds, then waits until its owner's gate is open, and
-- notes that it ran (rolled back with the step if the step is).
CREATE FUNCTION app.work(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	-- which role's step runs, for pg_locks to show: alice 1, bob 2
	PERFORM pg_advisory_xact_lock(CASE current_user WHEN 'alice' THEN 1 ELSE 2 END, (dwarf.flow_id() % 1000000)::int);
	PERFORM pg_sleep((s->>'sleep')::float8);
	WHILE NOT (SELECT open FROM public.gate WHERE who = current_user) LOOP
		PERFORM pg_sleep(0.05);
	END LOOP;
	INSERT INTO public.ran VALUES (dwarf.flow_id(), current_user);
	RETURN '{"done": true}';
END $$;
});
for my $role ('alice', 'bob')
{
	$node->safe_psql('postgres', qq{SELECT dwarf.define('work_$role', '{"tasks": {"W": "app.work"}}')},
		extra_params => [ '-U', $role ]);
}
wait_for_workers($node, 'two workers run');

# The task becomes known slow: its first step runs past dwarf.long_step in a
# worker, is preempted there, and runs again in a runner.
is($node->safe_psql('postgres',
		q{SET statement_timeout = '60 s';
		  SELECT status FROM dwarf.run('work_alice', '{"sleep": 0.4}', timeout => '50 s')},
		extra_params => [ '-U', 'alice' ]),
	'completed', "alice's warm-up flow completes");
is($node->safe_psql('postgres', q{SELECT count(*) FROM ran}), '1',
	'the warm-up ran once');
$node->safe_psql('postgres', q{TRUNCATE ran});

# ---------------------------------------------------------------- 1. bob's flow
$node->safe_psql('postgres', q{UPDATE gate SET open = false WHERE who = 'alice'});
my @alice = map {
	$node->safe_psql('postgres', qq{SELECT dwarf.create('work_alice', '{"sleep": 0, "i": $_}')},
		extra_params => [ '-U', 'alice' ])
} (1 .. 12);
my $alice_ids = join(',', @alice);
my $runners = q{SELECT count(*) FROM pg_stat_activity
 WHERE backend_type = 'dwarf runner' AND state = 'active'};
ok($node->poll_query_until('postgres', $runners, '4'),
	"alice's steps hold all four runners");

my $bob = $node->safe_psql('postgres', q{SELECT dwarf.create('work_bob', '{"sleep": 0.3}')},
	extra_params => [ '-U', 'bob' ]);

# A bounded poll: alice's steps would hold their runners for as long as the
# gate stays closed, so a wait of 30 s is as good as for ever.
my $bob_status;
my $deadline = time + 30;
while (time < $deadline)
{
	$bob_status = $node->safe_psql('postgres', "SELECT status FROM dwarf.flow WHERE id = $bob");
	last if $bob_status ne 'running';
	usleep(100_000);
}
is($bob_status, 'completed', "bob's slow flow completes while alice's steps hold the runners")
  or diag $node->safe_psql('postgres',
	"SELECT pid, state, backend_type, query FROM pg_stat_activity WHERE backend_type LIKE 'dwarf%'");
is($node->safe_psql('postgres',
		"SELECT string_agg(status, ',') FROM (SELECT DISTINCT status FROM dwarf.flow WHERE id IN ($alice_ids)) s"),
	'running', "alice's flows all still run");
is($node->safe_psql('postgres', "SELECT count(*) FROM dwarf.step WHERE flow_id IN ($alice_ids)"),
	'0', "alice's flows have no step row yet: the preempted step left none (no failure)");
my ($alice_oid, $bob_oid) = split /\|/, $node->safe_psql('postgres',
	q{SELECT 'alice'::regrole::oid || '|' || 'bob'::regrole::oid});
my @preempted = slurp_file($node->logfile) =~
  /a runner's step of flow (\d+) of role $alice_oid is preempted: .* while a step of role $bob_oid waits/g;
ok(@preempted >= 1 && !grep({ my $f = $_; !grep { $_ == $f } @alice } @preempted),
	"the log says a runner of alice's was preempted for bob's step")
  or diag "preempted: @preempted";

# ---------------------------------------------------------------- 3. back to alice
ok($node->poll_query_until('postgres', $runners, '4'),
	"with bob done, alice's steps hold all four runners again");

# ---------------------------------------------------------------- 2. exactly once
$node->safe_psql('postgres', q{UPDATE gate SET open = true WHERE who = 'alice'});
ok($node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id IN ($alice_ids) AND status = 'completed'", '12'),
	"once her gate opens, alice's twelve flows complete");
is($node->safe_psql('postgres',
		"SELECT count(*) || ' ' || count(DISTINCT flow_id) FROM ran WHERE flow_id IN ($alice_ids)"),
	'12 12', "each of alice's tasks wrote once");
is($node->safe_psql('postgres',
		"SELECT count(*) || ' ' || count(DISTINCT flow_id) || ' ' || max(attempt) || ' ' || string_agg(DISTINCT status, ',')
		   FROM dwarf.step WHERE flow_id IN ($alice_ids)"),
	'12 12 1 completed', "each of alice's flows has one completed step row, its first attempt");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE status = 'failed' OR error IS NOT NULL"),
	'0', 'no step failed');
is($node->safe_psql('postgres', "SELECT count(*) FROM ran WHERE flow_id = $bob"),
	'1', "bob's task wrote once");
unlike(slurp_file($node->logfile), qr/ended the process running it|ended before it was done/,
	'no preempted step was taken for a crash');
is(scalar(() = slurp_file($node->logfile) =~ /is preempted: /g), 1,
	"one runner was preempted, for bob's one step: none was preempted again within its share");

# ---------------------------------------------------------------- 4. shares
# alice's six steps hold the four runners; bob's three come: two of alice's
# runners are preempted, one for each of bob's steps up to his share (2 of
# 4), and no more: bob's third step waits, as alice's do.
my $before = () = slurp_file($node->logfile) =~ /is preempted: /g;
$node->safe_psql('postgres', q{UPDATE gate SET open = false});
my @alice2 = map {
	$node->safe_psql('postgres', qq{SELECT dwarf.create('work_alice', '{"sleep": 0, "j": $_}')},
		extra_params => [ '-U', 'alice' ])
} (1 .. 6);
my $held = q{SELECT coalesce(string_agg(n::text, ',' ORDER BY role), '') FROM
 (SELECT classid AS role, count(*) AS n FROM pg_locks
   WHERE locktype = 'advisory' AND granted GROUP BY classid) l};
ok($node->poll_query_until('postgres', $held, '4'), "alice's steps hold the four runners");
my @bob2 = map {
	$node->safe_psql('postgres', qq{SELECT dwarf.create('work_bob', '{"sleep": 0, "j": $_}')},
		extra_params => [ '-U', 'bob' ])
} (1 .. 3);
ok($node->poll_query_until('postgres', $held, '2,2'),
	"alice and bob hold two runners each, their fair share");
# Counted while the shares hold.  Once bob's steps end, the runners they
# free may go to alice's waiting steps first (the two roles' steps are on
# different workers) and bob's third step may then preempt one of hers
# again, rightly: he holds fewer than his share.
is(scalar(() = slurp_file($node->logfile) =~ /is preempted: /g) - $before, 2,
	"two of alice's runners were preempted, none after bob had his share");
$node->safe_psql('postgres', q{UPDATE gate SET open = true WHERE who = 'bob'});
ok($node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id IN (" . join(',', @bob2) . ") AND status = 'completed'", '3'),
	"bob's three flows complete");
$node->safe_psql('postgres', q{UPDATE gate SET open = true});
ok($node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id IN (" . join(',', @alice2) . ") AND status = 'completed'", '6'),
	"alice's six flows complete");
is($node->safe_psql('postgres',
		"SELECT count(*) || ' ' || count(DISTINCT flow_id) FROM ran WHERE flow_id IN (" . join(',', @alice2, @bob2) . ")"),
	'9 9', 'each of their tasks wrote once');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE status = 'failed' OR error IS NOT NULL OR attempt <> 1"),
	'0', 'no step failed or took a second attempt');

check_no_crash($node, 'no process crashed');
stop_node($node, $t0);
done_testing();
