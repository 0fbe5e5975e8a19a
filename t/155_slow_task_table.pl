# Copyright: dwarf project.
#
# 155_slow_task_table.pl: the tasks found slow are kept in a table of
# DWARF_SLOW_TASKS (256) entries in shared memory.  It holds the tasks found
# slow lately: when it is full, the one noted longest ago makes room, so a
# task found slow after 300 others still has its steps run by runners (a
# full table used to keep its first 256 tasks for good).
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
my $node = new_node('slow_task_table', 'dwarf.long_step' => "'20ms'");
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE TABLE ran (task int, backend_type text);
DO $$
BEGIN
	FOR i IN 1..300 LOOP
		EXECUTE format($f$CREATE FUNCTION slow_%s(s jsonb) RETURNS jsonb LANGUAGE sql AS $b$
			INSERT INTO ran SELECT %s, backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid();
			SELECT pg_sleep(0.03);
			SELECT '{}'::jsonb $b$ $f$, i, i);
		PERFORM dwarf.define('g' || i, format('{"tasks": {"S": "slow_%s"}}', i)::jsonb);
	END LOOP;
END $$;
});
wait_for_workers($node, 'two workers run');

# Each task runs once, in a worker, and is found slow.
$node->safe_psql('postgres', q{
DO $$
BEGIN
	FOR i IN 1..300 LOOP
		IF (SELECT status FROM dwarf.run('g' || i, '{}', timeout => '30 s')) <> 'completed' THEN
			RAISE EXCEPTION 'flow of g% did not complete', i;
		END IF;
	END LOOP;
END $$;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM ran WHERE backend_type = 'dwarf worker'}),
	'300', 'every task ran first in a worker');

# The last ones found slow, past the first 256, go to runners now.
for my $i (290, 300)
{
	is($node->safe_psql('postgres', qq{SELECT status FROM dwarf.run('g$i', '{}', timeout => '30 s')}),
		'completed', "g$i completes again");
	is($node->safe_psql('postgres',
			qq{SELECT backend_type FROM ran WHERE task = $i ORDER BY ctid DESC LIMIT 1}),
		'dwarf runner', "slow_$i, found slow after 256 others, ran in a runner");
}
check_no_crash($node);
stop_node($node, $t0);
done_testing();
