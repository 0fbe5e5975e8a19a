# Copyright: dwarf project.
#
# 090_worker_memory.pl: what a worker's memory grows with.
#
#  1. A for_each over 4,000 items (each branch sees the whole state, the
#     array included) peaks under 256 MB in the worker (it took 3.4 GB, n^2).
#  2. A 10,000-task graph, once run, holds under 256 MB in a worker (it held
#     520 MB and more, n^2).
#  3. CREATE FUNCTION elsewhere does not make the worker set up that graph's
#     calls again and grow (it added ~200 MB each time).
# Memory is read from /proc/<pid>/status of the dwarf workers (VmHWM, the
# peak, and VmRSS).
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
my $node = new_node('worker_memory');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION app.items(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('items', (SELECT jsonb_agg(jsonb_build_object('id', g,
		'name', 'item number ' || g)) FROM generate_series(1, (s->>'n')::int) g)) $$;
CREATE FUNCTION app.each(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('seen', jsonb_build_array(s->'itemIndex')) $$;
SELECT dwarf.define('wide', '{"tasks": {"A": "app.items", "B": "app.each", "J": "app.noop"},
  "transitions": [{"from": "A", "to": "B", "for_each": "items"}, {"from": "B", "to": "J"}],
  "fan_in": ["J"], "reducers": {"seen": "append"}}');
SELECT dwarf.define('big', jsonb_build_object(
  'tasks', (SELECT jsonb_object_agg('t' || g, 'app.noop') FROM generate_series(1, 10000) g),
  'transitions', jsonb_build_array(jsonb_build_object('chain',
    (SELECT jsonb_agg('t' || g ORDER BY g) FROM generate_series(1, 10000) g)))));
});
wait_for_workers($node, 'two workers run');

# kB of a field (VmHWM, VmRSS) of each dwarf worker, largest first.
sub worker_kb
{
	my ($field) = @_;
	my @kb;
	foreach my $pid (split /\n/, $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'"))
	{
		my ($v) = slurp_file("/proc/$pid/status") =~ /^$field:\s+(\d+) kB/m;
		push @kb, $v;
	}
	return sort { $b <=> $a } @kb;
}

# ---------------------------------------------------------------- 1. for_each
is($node->safe_psql('postgres', q{
SELECT status || ' ' || jsonb_array_length(state->'seen')
  FROM dwarf.run('wide', '{"n": 4000}', timeout => '300 s')}),
	'completed 4000', 'a for_each over 4,000 items completes, each index collected');
my ($peak) = worker_kb('VmHWM');
note("peak worker memory after the 4,000-wide for_each: $peak kB");
cmp_ok($peak, '<', 256 * 1024, 'the worker peaked under 256 MB');

# ---------------------------------------------------------------- 2. big graph
is($node->safe_psql('postgres', q{
SELECT string_agg(status, ',') FROM (SELECT (dwarf.run('big', '{}', timeout => '300 s')).status
  FROM generate_series(1, 2)) r}),
	'completed,completed', 'a 10,000-step flow of a 10,000-task graph completes, twice');
my ($held) = worker_kb('VmRSS');
note("worker memory with the 10,000-task graph compiled: $held kB");
cmp_ok($held, '<', 256 * 1024, 'a worker holds the 10,000-task graph in under 256 MB');

# ---------------------------------------------------------------- 3. CREATE FUNCTION
for my $i (1 .. 5)
{
	$node->safe_psql('postgres', qq{
CREATE FUNCTION app.other$i(s jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT '{}'::jsonb \$\$;
SELECT (dwarf.run('big', '{}', timeout => '300 s')).status;});
}
my ($after) = worker_kb('VmRSS');
note("worker memory after 5 CREATE FUNCTIONs and 5 more runs: $after kB");
cmp_ok($after - $held, '<', 50 * 1024,
	'five CREATE FUNCTIONs elsewhere grew the worker by less than 50 MB in all');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
