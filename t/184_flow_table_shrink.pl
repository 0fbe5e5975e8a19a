# Copyright: dwarf project.
#
# 184_flow_table_shrink.pl: a worker's table of flows is made anew, smaller,
# once it holds far fewer flows than it once did (ShrinkFlowTable, when the
# worker is idle), and the flows it still holds go on exactly as before.
#
# Each worker holds 9,000 flows at once (each waits at two external steps of
# a fan-out, and a flow waiting for an external step stays in memory), then
# all but 500 of them close; the workers go idle, and the table shrinks with
# 500 flows in it, each of them one branch still waiting.  Those flows must
# then complete, merging their branches at the fan-in.  (The table's entries
# are moved, and with them the head of each flow's list of branches: left
# pointing at the old head, the list broke, and the flows with it.)
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
# 36,000 steps of one role offered at once: a role alone holds at most half
# of dwarf.max_external_steps (the rest is kept for other roles).
my $node = new_node('flow_table_shrink', 'dwarf.max_external_steps' => 80000);
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE FUNCTION public.fork(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION public.join(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('joined', s->'got') $$;
SELECT dwarf.define('pair', '{"tasks": {"F": "public.fork",
	"E1": {"external": "x", "lease": "30 min"}, "E2": {"external": "x", "lease": "30 min"},
	"J": "public.join"},
  "transitions": [{"from": "F", "to": ["E1", "E2"]}, {"from": "E1", "to": "J"}, {"from": "E2", "to": "J"},
	{"from": "J", "to": "END"}],
  "fan_in": ["J"], "reducers": {"got": "append"}}');
CREATE TABLE keep (id bigint PRIMARY KEY);
CREATE TABLE held (lease bigint);
});
wait_for_workers($node, 'two workers run');

my $flows = 18000;
my $kept  = 1000;
$node->safe_psql('postgres', qq{
SELECT count(dwarf.create('pair', '{}')) FROM generate_series(1, $flows);
INSERT INTO keep SELECT id FROM dwarf.flow ORDER BY id DESC LIMIT $kept;
});
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.external_steps('x')}, 2 * $flows),
	'every flow waits at its two external steps');

# Every step but the E2 of the kept flows is completed; those are claimed
# and held.
my $claimed = 0;
while ($claimed < 2 * $flows)
{
	my $n = $node->safe_psql('postgres', q{
		WITH c AS (SELECT * FROM dwarf.claim('x', 2000, '30 min', '5 s')),
		     h AS (INSERT INTO held SELECT lease FROM c WHERE task = 'E2' AND flow_id IN (SELECT id FROM keep))
		SELECT count(*) || ' ' || count(dwarf.complete(lease, jsonb_build_object('got', task)))
		  FILTER (WHERE NOT (task = 'E2' AND flow_id IN (SELECT id FROM keep)))
		  FROM c});
	my ($got) = split / /, $n;
	last if $got == 0;
	$claimed += $got;
}
is($claimed, 2 * $flows, 'every step was claimed');
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.flow WHERE status = 'running'}, $kept),
	'all but the kept flows completed');
is($node->safe_psql('postgres', q{SELECT count(*) FROM held}), $kept, 'one step of each kept flow is held');

# The workers are idle now, and shrink their tables of flows (a tenth of
# the 9,000 each held): give them a moment to, then answer the held steps.
usleep(1_500_000);
$node->safe_psql('postgres', q{SELECT count(dwarf.complete(lease, '{"got": "E2"}')) FROM held});
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM dwarf.flow WHERE status = 'running'}, '0'),
	'the kept flows complete after the table shrank');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM dwarf.flow f JOIN keep k USING (id)
	 WHERE f.status = 'completed' AND f.state->'joined' @> '["E1", "E2"]'}), $kept,
	'each kept flow merged both branches at its fan-in');
is($node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.flow WHERE status <> 'completed'}), '0',
	'no flow failed');
check_no_crash($node, 'no process crashed');
stop_node($node, $t0);
done_testing();
