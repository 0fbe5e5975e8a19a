# Copyright: dwarf project.
#
# 200_external_memory_per_role.pl: dwarf.external_memory, the shared memory
# that offered steps' inputs, baggage and HTTP calls take, is divided
# between the roles that own offered steps, as the offers themselves are
# (t/197): one role's steps with large inputs cannot fill it for everyone.
#
#  1. mallory (USAGE on dwarf only) has 200 external steps with 20 kB inputs
#     (4 MB) waiting, never claimed, with dwarf.external_memory at 1 MB:
#     she holds at most her share of it (half, while she is alone), and the
#     log says why her other steps wait, naming the setting; then 2000
#     steps with inputs as small as alice's, to fill whatever room is left;
#  2. alice's external step with a small input is still offered and claimed
#     (before, mallory's steps took the whole area and alice's step waited
#     until mallory's were answered);
#  3. mallory's backlog is offered as room frees: she claims and completes
#     all 2200.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $memory = 1024 * 1024;		# dwarf.external_memory, in bytes
my $input = 20000;				# bytes of each of mallory's inputs
my $started = time;
my $node = new_node('external_memory_per_role', 'dwarf.external_memory' => '1MB',
	'dwarf.min_retry_delay' => 0);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE mallory LOGIN;
GRANT USAGE ON SCHEMA dwarf TO alice, mallory;
});
wait_for_workers($node, 'two workers run');
is($node->safe_psql('postgres', 'SHOW dwarf.external_memory'), '1MB',
	'dwarf.external_memory is 1 MB');
for my $role (qw(alice mallory))
{
	$node->safe_psql('postgres', q{
		SELECT dwarf.define('ext', '{"tasks": {"X": {"external": "q", "lease": "10 min"}},
		  "transitions": [{"from": "X", "to": "END"}]}')},
		extra_params => [ '-U', $role ]);
}

# The steps of queue q that $role sees offered.
sub offered_to
{
	my ($role) = @_;
	return $node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.external_steps('q')},
		extra_params => [ '-U', $role ]);
}

# ------------------------------------------------------------------ 1. mallory's share
$node->safe_psql('postgres',
	qq{SELECT dwarf.create('ext', jsonb_build_object('blob', repeat('x', $input), 'i', i))
	   FROM generate_series(1, 200) i},
	extra_params => [ '-U', 'mallory' ]);
my $until = time + 60;
sleep(0.2) while offered_to('mallory') < 5 && time < $until;
cmp_ok(offered_to('mallory'), '>=', 5, "mallory's steps are offered");
sleep(3);	# every worker has tried to offer all of mallory's steps by now
my $offered = offered_to('mallory');
my $share = int($memory / 2 / $input);
cmp_ok($offered, '<=', $share,
	"mallory's inputs hold at most half of dwarf.external_memory ($offered steps of 20 kB offered)");
cmp_ok($offered, '<', 200, 'the rest of her backlog waits in its flows');

# Steps with inputs the size of alice's fill the room mallory's large ones
# left: without shares, no gap as large as alice's step stays free.
$node->safe_psql('postgres',
	q{SELECT dwarf.create('ext', '{"small": 2}') FROM generate_series(1, 2000)},
	extra_params => [ '-U', 'mallory' ]);
$until = time + 60;
sleep(0.2) while offered_to('mallory') <= $offered && time < $until;
sleep(3);
diag sprintf("mallory has %d steps offered", offered_to('mallory'));

# ------------------------------------------------------------------ 2. alice's step
my $t0 = time;
my $a = $node->safe_psql('postgres', q{SELECT dwarf.create('ext', '{"small": 1}')},
	extra_params => [ '-U', 'alice' ]);
my $claimed = $node->safe_psql('postgres',
	q{SELECT flow_id FROM dwarf.claim('q', 1, NULL, '60 s')}, extra_params => [ '-U', 'alice' ]);
my $delay = time - $t0;
is($claimed, $a, "alice's small step is offered and claimed while mallory's large inputs wait");
diag sprintf("alice's step was claimed %.3f s after its create", $delay);

like(slurp_file($node->logfile), qr/its share of dwarf\.external_memory/,
	'the log says why mallory\'s steps wait, naming dwarf.external_memory');
# Each of the two workers says so at most once per 10 s.
my $lines = () = slurp_file($node->logfile) =~ /wait for room to be offered/g;
my $bound = 2 * (int((time - $started) / 10) + 2);
cmp_ok($lines, '<=', $bound, "it says so once in a while, not once a step ($lines lines)");

# ------------------------------------------------------------------ 3. mallory's backlog drains
my $done = 0;
my $deadline = time + 180;
while ($done < 2200 && time < $deadline)
{
	$done += $node->safe_psql('postgres', q{
		SELECT count(dwarf.complete(lease, '{}')) FROM dwarf.claim('q', 1000, NULL, '5 s')},
		extra_params => [ '-U', 'mallory' ]);
}
is($done, 2200, "mallory's whole backlog is offered, claimed and completed as room frees");
$until = time + 60;
sleep(0.2)
  while $node->safe_psql('postgres',
	q{SELECT count(*) FROM dwarf.flow WHERE owner = 'mallory'::regrole AND status = 'running'}) > 0
  && time < $until;
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM dwarf.flow WHERE owner = 'mallory'::regrole AND status = 'completed'}),
	'2200', "mallory's 2200 flows complete");

done_testing();
