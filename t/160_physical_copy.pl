# Copyright: dwarf project.
#
# 160_physical_copy.pl: a physical copy of a server (pg_basebackup) started
# as a primary of its own holds the same flows and sequences as its source,
# so it hands out the same flow ids and step keys.  The documented step for
# a copy that runs apart from its source is dwarf.new_incarnation(): from
# then on every dwarf.step_key() of the copy carries a tag of its own, and
# no key of the copy is one its source gives.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $source = new_node('source', wal_level => 'replica', max_wal_senders => 4);
$source->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE TABLE keys (k text PRIMARY KEY);
CREATE FUNCTION keyed(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	INSERT INTO keys VALUES (dwarf.step_key()) RETURNING jsonb_build_object('key', k) $$;
SELECT dwarf.define('pay', '{"tasks": {"A": "keyed", "B": "keyed"},
  "transitions": [{"chain": ["A", "B"]}]}');
CREATE ROLE app LOGIN;
});
wait_for_workers($source, 'the source runs');

# The step keys of one new flow of graph pay on $node, one per line.
sub run_keys
{
	my ($node) = @_;
	my $id = $node->safe_psql('postgres',
		q{SELECT flow_id FROM dwarf.run('pay', '{}', timeout => '30 s') WHERE status = 'completed'});
	return $node->safe_psql('postgres',
		"SELECT k FROM keys WHERE k LIKE '%$id-%' ORDER BY k");
}

my $first = run_keys($source);
like($first, qr/^\d+-\d+-\d+-A\n\d+-\d+-\d+-B$/, 'a server that never took a tag gives untagged keys');

$source->backup('copy');
my $copy = PostgreSQL::Test::Cluster->new('copy');
$copy->init_from_backup($source, 'copy');
$copy->start;
wait_for_workers($copy, 'the copy runs as a primary of its own');

# Left alone, the copy repeats its source's ids and keys.
is(run_keys($copy), run_keys($source), 'without the step, the copy gives the keys its source gives');

# The documented step.
is($copy->psql('postgres', 'SELECT dwarf.new_incarnation()', extra_params => ['-U', 'app']),
	3, 'an ordinary role may not take a new incarnation');
my $tag = $copy->safe_psql('postgres', 'SELECT dwarf.new_incarnation()');
like($tag, qr/^[0-9a-f]{16}$/, 'the copy takes a tag of its own');

my $copy_keys   = run_keys($copy);
my $source_keys = run_keys($source);
like($copy_keys, qr/^\Q$tag\E\/\d+-\d+-\d+-A\n\Q$tag\E\/\d+-\d+-\d+-B$/,
	"the copy's keys carry its tag");
isnt($copy_keys, $source_keys, 'the copy and its source give different keys for their next flows');

# The tag is the database's: it survives a restart, and a dump keeps it.
$copy->restart;
wait_for_workers($copy, 'the copy runs again');
like(run_keys($copy), qr/^\Q$tag\E\//, 'the tag outlives a restart');
$copy->command_ok(['pg_dump', '-Fc', '-f', $copy->basedir . '/copy.dump', '-d', $copy->connstr('postgres')],
	'the copy dumps');
$copy->safe_psql('postgres', 'CREATE DATABASE restored');
$copy->command_ok(['pg_restore', '--single-transaction', '-d', $copy->connstr('restored'),
		$copy->basedir . '/copy.dump'], 'and restores');
is($copy->safe_psql('restored', 'SELECT tag FROM dwarf.incarnation'), $tag,
	'the restored database keeps the tag');

check_no_crash($source);
check_no_crash($copy);
$copy->stop;
$source->stop;
done_testing();
