# Copyright: dwarf project.
#
# 203_graph_cache.pl: a worker's memory follows the flows it holds, not how
# many graphs exist.  A worker keeps the compiled graph versions its loaded
# flows run, and at most 256 others (the least recently used go first).
# Before, it kept every graph it ever ran (about 19 kB each): 65,000 small
# graphs took 1.07 GB in each worker.
#
#  1. after flows of 600 graphs, flows of 3,200 more: the workers' memory
#     (the grand total of their memory contexts, as
#     pg_log_backend_memory_contexts logs it) grows by less than 8 MB
#     (3,200 more graphs kept would be about 30 MB a worker);
#  2. a graph that a loaded flow runs is not freed under it: 200 flows of
#     200 other graphs sleep (in memory) while the 3,000 run, then go on to
#     their next task and complete with the right state.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $start = time;
my $node  = new_node('graph_cache');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.echo(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"echoed": true}'::jsonb $$;
CREATE FUNCTION app.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep('4 s');
	RETURN '{"napped": true}';
END $$;
CREATE FUNCTION app.last(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT jsonb_build_object('last', s->>'n') $$;
DO $$
BEGIN
	FOR i IN 1 .. 3600 LOOP
		PERFORM dwarf.define('g' || i, '{"tasks": {"A": "app.echo"}}');
	END LOOP;
	FOR i IN 1 .. 200 LOOP
		PERFORM dwarf.define('s' || i, '{"tasks": {"Nap": "app.nap", "Last": "app.last"},
		  "transitions": [{"from": "Nap", "to": "Last"}]}');
	END LOOP;
END $$;
});
wait_for_workers($node, 'two workers run');

# Runs one flow of each graph g<from> .. g<to>, and waits for them all.
sub run_graphs
{
	my ($from, $to) = @_;
	$node->safe_psql('postgres',
		"SELECT count(dwarf.create('g' || i, '{}')) FROM generate_series($from, $to) i");
	ok( $node->poll_query_until('postgres',
			"SELECT count(*) FROM dwarf.flow WHERE status = 'completed' AND state ? 'echoed'",
			$to),
		"flows of graphs g1 to g$to completed");
}

# The workers' memory: the grand total their memory contexts use, in bytes.
sub workers_memory
{
	my $total = 0;
	for my $pid (split /\n/, $node->safe_psql('postgres',
			q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'}))
	{
		my $offset = -s $node->logfile;
		$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($pid)");
		$node->wait_for_log(qr/\[$pid\] LOG:  Grand total: \d+ bytes in \d+ blocks; \d+ free \(\d+ chunks\); \d+ used/,
			$offset);
		my ($used) = substr(slurp_file($node->logfile), $offset)
		  =~ /\[$pid\] LOG:  Grand total: \d+ bytes in \d+ blocks; \d+ free \(\d+ chunks\); (\d+) used/;
		$total += $used;
	}
	return $total;
}

# ---------------------------------------------------------------- 1. memory
run_graphs(1, 600);
my $before = workers_memory();

# 200 flows sleep in memory, their graphs held, while 3,000 graphs run.
my $ids = $node->safe_psql('postgres',
	q{SELECT string_agg(dwarf.create('s' || i, jsonb_build_object('n', i))::text, ',')
		FROM generate_series(1, 200) i});
run_graphs(601, 3600);
is( $node->safe_psql('postgres', qq{
		SELECT count(*) FROM dwarf.flow f WHERE f.id IN ($ids) AND f.status = 'running'
		   AND EXISTS (SELECT FROM dwarf.step s WHERE s.flow_id = f.id AND s.task = 'Nap')}),
	'200', 'meanwhile, the 200 flows of graphs s1 to s200 slept after their first step');

# ---------------------------------------------------------------- 2. held graphs
ok( $node->poll_query_until('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id IN ($ids) AND status = 'completed'", '200'),
	'the 200 sleeping flows go on and complete');
is( $node->safe_psql('postgres', qq{
		SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE f.id IN ($ids) AND f.state->>'last' = substr(g.name, 2) AND (f.state->>'napped')::bool}),
	'200', 'each with the state its own graph gave it');

# ---------------------------------------------------------------- 1. memory, after
my $after = workers_memory();
cmp_ok($after - $before, '<', 8 * 1024 * 1024,
	sprintf('the workers hold %.1f MB after 3,800 graphs, %.1f MB after 600',
		$after / 1048576, $before / 1048576));

check_no_crash($node, 'no process crashed');
stop_node($node, $start);
done_testing();
