# Copyright: dwarf project.
#
# 190_load_by_index.pl: a worker loads the flows a bulk create made by the
# flow table's primary key, however many closed flows the table holds.
#
# A worker loads new flows a thousand at a time with one statement
# ("id = ANY($1)").  Planned for its keys against the table's statistics,
# that statement read the whole flow table whenever the table had none: a
# table not yet analyzed (a fresh install until autovacuum first gets to
# it, a restored one) gives each key PostgreSQL's default selectivity, and
# a thousand keys then cover the table.  Every chunk of a bulk create cost
# a sequential scan of every flow not yet archived.  Here autovacuum is off
# and the table holds 20,000 closed flows that no ANALYZE has counted; a
# statement creates 3,000 more, and the flow table must see no sequential
# scan while the workers load and run them.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $node = new_node('load_by_index', autovacuum => 'off');
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE FUNCTION public.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
SELECT dwarf.define('one', '{"tasks": {"A": "public.noop"}, "transitions": [{"from": "A", "to": "END"}]}');
});
wait_for_workers($node, 'two workers run');

# This script's own statements read dwarf.flow by its key only: no
# sequential scan of theirs counts against the workers'.
$ENV{PGOPTIONS} = '-c enable_seqscan=off';

# One test: no flow runs any more (read by key: "id > 0").
sub all_closed
{
	my ($message) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return ok(
		$node->poll_query_until('postgres',
			"SELECT count(*) FROM dwarf.flow WHERE id > 0 AND status = 'running'", '0'),
		$message);
}

$node->safe_psql('postgres', q{SELECT count(dwarf.create('one', '{}')) FROM generate_series(1, 20000)});
all_closed('20,000 flows closed');

# A worker's table statistics reach pg_stat_user_tables when it next
# reports them; every flow's close is an update of its row, so once the
# updates counted match the flows closed, everything the workers did
# before those closes has been reported too.
sub flow_counts
{
	return $node->safe_psql('postgres',
		"SELECT seq_scan || ' ' || n_tup_upd FROM pg_stat_user_tables WHERE relid = 'dwarf.flow'::regclass");
}
ok( $node->poll_query_until('postgres',
		"SELECT n_tup_upd >= 20000 FROM pg_stat_user_tables WHERE relid = 'dwarf.flow'::regclass"),
	"the 20,000 closes are in the flow table's statistics");
my ($scans0, $updates0) = split / /, flow_counts();

$node->safe_psql('postgres', q{SELECT count(dwarf.create('one', '{}')) FROM generate_series(1, 3000)});
all_closed('the 3,000 new flows closed');
ok( $node->poll_query_until('postgres',
		"SELECT n_tup_upd >= $updates0 + 3000 FROM pg_stat_user_tables WHERE relid = 'dwarf.flow'::regclass"),
	"their closes are in the flow table's statistics");
my ($scans1) = split / /, flow_counts();
is($scans1 - $scans0, 0, 'loading and running 3,000 flows scanned the flow table sequentially 0 times');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.flow WHERE id > 0 AND status = 'completed'"),
	'23000', 'every flow completed');

$node->stop;
done_testing();
