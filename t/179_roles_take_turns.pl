# Copyright: dwarf project.
#
# 179_roles_take_turns.pl: one role's backlog of ready steps does not queue
# before another role's.  alice creates 1,000 flows at once, each a task of
# 20 ms (20 s of work for the one worker); bob's flow of the same task,
# created after them, completes while most of alice's still wait: the ready
# queue serves each role (and fairness key) in turn, not first come, first
# served across roles.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $node = new_node('roles_take_turns', 'dwarf.workers' => 1);
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
GRANT USAGE ON SCHEMA app, dwarf TO alice, bob;
CREATE FUNCTION app.work(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.pg_sleep(0.02);
	RETURN '{"done": true}';
END $$;
GRANT EXECUTE ON FUNCTION app.work(jsonb) TO alice, bob;
});
wait_for_workers($node, 'the worker runs', count => 1);
for my $role ('alice', 'bob')
{
	$node->safe_psql('postgres', q{SELECT dwarf.define('work', '{"tasks": {"W": "app.work"}}')},
		extra_params => [ '-U', $role ]);
}

$node->safe_psql('postgres', q{SELECT count(dwarf.create('work', '{}')) FROM generate_series(1, 1000)},
	extra_params => [ '-U', 'alice' ]);
my $bob = $node->safe_psql('postgres', q{SELECT dwarf.create('work', '{}')},
	extra_params => [ '-U', 'bob' ]);
ok($node->poll_query_until('postgres', "SELECT status FROM dwarf.flow WHERE id = $bob", 'completed'),
	"bob's flow completes");
my $waiting = $node->safe_psql('postgres',
	q{SELECT count(*) FROM dwarf.flow WHERE owner = 'alice'::regrole AND status = 'running'});
cmp_ok($waiting, '>', 500, "bob's flow did not wait for alice's backlog ($waiting of her 1,000 still running)");

ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM dwarf.flow WHERE owner = 'alice'::regrole AND status = 'running'}),
	"alice's flows all complete");

done_testing();
