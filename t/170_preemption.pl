# Copyright: dwarf project.
#
# 170_preemption.pl: no task holds a dwarf worker for longer than about
# dwarf.long_step, however it behaves, and a cancel stops a running step.
#
#  1. Loops: mallory's two flows whose task loops forever are taken off the
#     workers (preempted, rolled back, run again in runners), so alice's
#     2-step dwarf.run keeps completing; mallory's cancel stops the loops in
#     the runners, the flows end cancelled and no dwarf process stays busy.
#  2. Locks: a task waiting on a lock the test session holds is taken off its
#     worker the same way; others' flows keep completing, and once the lock
#     is released the step completes, in a runner, and its write is there
#     once.
#  3. dwarf.max_step_time: a runner's step that runs past it fails with an
#     error that names the setting.
#  4. Runners off (dwarf.max_runners = 0): a looping task keeps its worker as
#     before, but its flow's cancel stops it, and the worker serves the
#     others again.
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
my $node = new_node('preemption', max_worker_processes => 32,
	'dwarf.long_step' => "'200ms'");

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE mallory LOGIN;
CREATE ROLE alice LOGIN;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app TO PUBLIC;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.spin(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	LOOP
	END LOOP;
END $$;
CREATE TABLE locked (flow_id bigint, ran_in text);
GRANT INSERT ON locked TO PUBLIC;
CREATE FUNCTION app.backend_type() RETURNS text LANGUAGE sql SECURITY DEFINER
	SET search_path = pg_catalog AS $$
	SELECT backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid() $$;
CREATE FUNCTION app.take_lock(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	INSERT INTO locked VALUES (dwarf.flow_id(), app.backend_type());
	SELECT '{"locked": true}'::jsonb $$;
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT pg_sleep((s->>'sleep')::float8); SELECT '{}'::jsonb $$;
GRANT USAGE ON SCHEMA dwarf TO mallory, alice;
});
# Each role defines the graphs it runs.
$node->safe_psql('postgres', q{
SELECT dwarf.define('quick', '{"tasks": {"A": "app.noop", "B": "app.noop"},
  "transitions": [{"from": "A", "to": "B"}]}');
}, extra_params => [ '-U', 'alice' ]);
$node->safe_psql('postgres', q{
SELECT dwarf.define('spin', '{"tasks": {"S": "app.spin"}}');
SELECT dwarf.define('lock', '{"tasks": {"L": "app.take_lock"}}');
SELECT dwarf.define('nap', '{"tasks": {"N": "app.nap"}}');
}, extra_params => [ '-U', 'mallory' ]);
wait_for_workers($node, 'two workers run');

# Ten 2-step runs of alice's, each bounded by a statement timeout: one test
# that all of them complete (it stops at the first that does not).
sub alice_runs
{
	my ($message) = @_;
	my @statuses;
	for my $i (1 .. 10)
	{
		my ($rc, $out, $err) = $node->psql('postgres',
			"SET statement_timeout = '8 s';
			 SELECT status FROM dwarf.run('quick', '{\"i\": $i}', timeout => '6 s')",
			extra_params => [ '-U', 'alice' ]);
		push @statuses, $rc == 0 ? $out : "error: $err";
		last if $statuses[-1] ne 'completed';    # one is enough to fail
	}
	return is(join(',', grep { $_ ne 'completed' } @statuses), '', $message);
}

# Dwarf's processes running something (not idle).
my $busy = q{SELECT count(*) FROM pg_stat_activity
 WHERE backend_type IN ('dwarf worker', 'dwarf runner') AND state = 'active'};

# ---------------------------------------------------------------- 1. loops
my @spin = map {
	$node->safe_psql('postgres', q{SELECT dwarf.create('spin', '{}')},
		extra_params => [ '-U', 'mallory' ])
} (1, 2);
ok($node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		 WHERE backend_type = 'dwarf runner' AND state = 'active'}, '2'),
	'the two looping steps are taken off the workers and run in runners');
alice_runs("alice's runs complete while mallory's tasks loop");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE flow_id IN ($spin[0], $spin[1])"),
	'0', 'the preempted steps left no step row (not counted as errors)');

for my $id (@spin)
{
	$node->safe_psql('postgres', "SELECT dwarf.cancel($id, 'enough')",
		extra_params => [ '-U', 'mallory' ]);
}
ok($node->poll_query_until('postgres', $busy, '0'),
	'after the cancels, no dwarf worker or runner stays busy');
is($node->safe_psql('postgres',
		"SELECT string_agg(status, ',') FROM dwarf.flow WHERE id IN ($spin[0], $spin[1])"),
	'cancelled,cancelled', 'the looping flows end cancelled');
ok($node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf runner'", '0'),
	'their runners are gone');

# ---------------------------------------------------------------- 2. locks
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN; LOCK TABLE locked IN ACCESS EXCLUSIVE MODE');
my @waiting = map {
	$node->safe_psql('postgres', q{SELECT dwarf.create('lock', '{}')},
		extra_params => [ '-U', 'mallory' ])
} (1, 2);
ok($node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		 WHERE backend_type = 'dwarf runner' AND wait_event_type = 'Lock'}, '2'),
	'the steps waiting on the lock are taken off the workers and wait in runners');
alice_runs("alice's runs complete while mallory's tasks wait on a lock");
$holder->query_safe('COMMIT');
ok($node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id IN ($waiting[0], $waiting[1]) AND status = 'completed'",
		'2'),
	'once the lock is released, the waiting flows complete');
is($node->safe_psql('postgres',
		"SELECT string_agg(ran_in, ',') FROM locked WHERE flow_id IN ($waiting[0], $waiting[1])"),
	'dwarf runner,dwarf runner', "each task's write is there once, from a runner");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE flow_id IN ($waiting[0], $waiting[1]) AND status = 'completed'"),
	'2', 'each flow has one completed step');
$holder->quit;

# ---------------------------------------------------------------- 3. max_step_time
$node->safe_psql('postgres', q{ALTER SYSTEM SET dwarf.max_step_time = '1s'; SELECT pg_reload_conf()});
my $nap = $node->safe_psql('postgres', q{SELECT dwarf.create('nap', '{"sleep": 30}')},
	extra_params => [ '-U', 'mallory' ]);
ok($node->poll_query_until('postgres',
		"SELECT status <> 'running' FROM dwarf.flow WHERE id = $nap"),
	'the long step ends');
like($node->safe_psql('postgres', "SELECT status || ': ' || error FROM dwarf.flow WHERE id = $nap"),
	qr/^failed: .*dwarf\.max_step_time/, 'it failed with an error naming dwarf.max_step_time');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET dwarf.max_step_time; SELECT pg_reload_conf()});

# ---------------------------------------------------------------- 4. cancel, runners off
$node->safe_psql('postgres', q{ALTER SYSTEM SET dwarf.max_runners = 0; SELECT pg_reload_conf()});
my $id = $node->safe_psql('postgres', q{SELECT dwarf.create('spin', '{}')},
	extra_params => [ '-U', 'mallory' ]);
ok($node->poll_query_until('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		 WHERE backend_type = 'dwarf worker' AND state = 'active'
		   AND now() - state_change > interval '1 s'}, '1'),
	'with runners off, the looping step keeps its worker');
$node->safe_psql('postgres', "SELECT dwarf.cancel($id, 'enough')",
	extra_params => [ '-U', 'mallory' ]);
ok($node->poll_query_until('postgres', $busy, '0'), 'the cancel stops the looping step');
is($node->safe_psql('postgres', "SELECT status FROM dwarf.flow WHERE id = $id"),
	'cancelled', 'the flow stays cancelled');
alice_runs("alice's runs complete on every worker again");
$node->safe_psql('postgres', q{ALTER SYSTEM RESET dwarf.max_runners; SELECT pg_reload_conf()});

check_no_crash($node, 'no process crashed');
stop_node($node, $t0);
done_testing();
