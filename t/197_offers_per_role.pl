# Copyright: dwarf project.
#
# 197_offers_per_role.pl: the offers of external tasks are held to each
# role's rights and share.
#
#  1. revoked means revoked: bob, a member of alice, claims her steps; once
#     alice is revoked from bob, bob's open session claims none of hers
#     (its cache of allowed owners is dropped on pg_auth_members changes);
#  2. the offer pool is sized and shared per role: dwarf.max_external_steps
#     (set low) is never exceeded however many steps mallory has waiting,
#     mallory holds at most her share, and alice's external step is still
#     offered and claimable; mallory's backlog is offered as room frees;
#     the log says so once in a while, not once a step;
#  3. a claim on a queue name no task has leaves no queue behind: 1100
#     such claims (a server keeps 1024 queues) are all served;
#  4. what a dropped database held in the pool is freed.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use FindBin;
use lib $FindBin::Bin;
use DwarfTest;

my $max = 20;
my $node = new_node('offers_per_role', 'dwarf.max_external_steps' => $max,
	'dwarf.min_retry_delay' => 0);

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE ROLE mallory LOGIN;
GRANT USAGE ON SCHEMA dwarf TO alice, bob, mallory;
GRANT alice TO bob;
});
wait_for_workers($node, 'two workers run');
for my $role (qw(alice mallory))
{
	$node->safe_psql('postgres', q{
		SELECT dwarf.define('ext', '{"tasks": {"X": {"external": "q", "lease": "10 min"}},
		  "transitions": [{"from": "X", "to": "END"}]}')},
		extra_params => [ '-U', $role ]);
}

# ------------------------------------------------------------------ 1. revoked
$node->safe_psql('postgres', q{SELECT dwarf.create('ext') FROM generate_series(1, 2)},
	extra_params => [ '-U', 'alice' ]);
my $bob = $node->background_psql('postgres', extra_params => [ '-U', 'bob' ]);
is($bob->query_safe(q{SELECT count(*) FROM dwarf.claim('q', 1, NULL, '20 s')}), '1',
	"bob, a member of alice, claims one of alice's steps");
$node->safe_psql('postgres', 'REVOKE alice FROM bob');
is($bob->query_safe(q{SELECT count(*) FROM dwarf.claim('q', 1, NULL, '1 s')}), '0',
	"after REVOKE alice FROM bob, bob's open session claims none of alice's steps");
$node->safe_psql('postgres', 'GRANT alice TO bob');
is($bob->query_safe(q{SELECT count(*) FROM dwarf.claim('q', 1, NULL, '20 s')}), '1',
	'granted again, it claims her other step');
$bob->quit;
# Alice's two steps are leased (10 min): they count as hers below.

# ------------------------------------------------------------------ 2. the pool, shared
# mallory: 200 steps, never claimed.
$node->safe_psql('postgres', q{SELECT dwarf.create('ext') FROM generate_series(1, 200)},
	extra_params => [ '-U', 'mallory' ]);
# The steps of queue q that $role sees offered.
sub offered_to
{
	my ($role) = @_;
	return $node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.external_steps('q')},
		extra_params => [ '-U', $role ]);
}
my $until = time + 60;
sleep(0.2) while offered_to('mallory') < 5 && time < $until;
cmp_ok(offered_to('mallory'), '>=', 5, "mallory's steps are offered");
sleep(3);	# every worker has tried to offer all of mallory's steps by now
my $offered = offered_to('mallory');
cmp_ok($offered, '<=', $max / 2, "mallory holds at most her share of dwarf.max_external_steps ($offered)");
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM dwarf.external_steps()}), '<=', $max,
	'dwarf.max_external_steps is never exceeded');

# alice's new step is offered and claimable, within generous polling.
my $t0 = time;
my $a = $node->safe_psql('postgres', q{SELECT dwarf.create('ext')}, extra_params => [ '-U', 'alice' ]);
my $claimed = $node->safe_psql('postgres',
	q{SELECT flow_id FROM dwarf.claim('q', 1, NULL, '60 s')}, extra_params => [ '-U', 'alice' ]);
my $delay = time - $t0;
is($claimed, $a, "alice's step is offered and claimed while mallory's backlog waits");
diag sprintf("alice's step was claimed %.3f s after its create", $delay);

# mallory's backlog is offered as room frees: she claims and completes
# steps, and more of hers are offered, till all are done.
my $done = 0;
my $deadline = time + 180;
while ($done < 200 && time < $deadline)
{
	my $n = $node->safe_psql('postgres', q{
		SELECT count(dwarf.complete(lease, '{}')) FROM dwarf.claim('q', 50, NULL, '5 s')},
		extra_params => [ '-U', 'mallory' ]);
	$done += $n;
}
is($done, 200, "mallory's whole backlog is offered, claimed and completed as room frees");
my $lines = () = slurp_file($node->logfile) =~ /wait for room to be offered/g;
cmp_ok($lines, '<=', 30, "the log says steps wait for room once in a while ($lines lines)");
like(slurp_file($node->logfile), qr/its share of dwarf\.max_external_steps/,
	'the log names the setting');

# ------------------------------------------------------------------ 3. queues
# More claims that wait on made-up queue names than a server keeps queues
# (1024): each name's queue goes when its claim ends.
is($node->safe_psql('postgres', q{
	DO $$ BEGIN
		FOR i IN 1..1100 LOOP
			PERFORM * FROM dwarf.claim('made-up-' || i, 1, NULL, '1 ms');
		END LOOP;
	END $$; SELECT 'done'}, extra_params => [ '-U', 'alice' ]), 'done',
	'1100 claims on made-up queue names leave no queue behind (a server keeps 1024)');

# ------------------------------------------------------------------ 4. a dropped database
# mallory's steps in database db2 hold her share of the pool (roles are
# the server's), so alice's share is a third: 6 of 20.  Once db2 is
# dropped, what it held is freed, and alice's share is half: 10.
$node->safe_psql('postgres', 'CREATE DATABASE db2');
$node->safe_psql('db2', q{CREATE EXTENSION dwarf; GRANT USAGE ON SCHEMA dwarf TO mallory});
$node->safe_psql('db2', q{
	SELECT dwarf.define('ext', '{"tasks": {"X": {"external": "q", "lease": "10 min"}},
	  "transitions": [{"from": "X", "to": "END"}]}');
	SELECT dwarf.create('ext') FROM generate_series(1, 30)}, extra_params => [ '-U', 'mallory' ]);
$until = time + 60;
sleep(0.2) while $node->safe_psql('db2', q{SELECT count(*) FROM dwarf.external_steps('q')}) < 5
  && time < $until;
$node->safe_psql('postgres', q{SELECT dwarf.create('ext') FROM generate_series(1, 20)},
	extra_params => [ '-U', 'alice' ]);
sleep(3);
cmp_ok(offered_to('alice'), '<=', 6, "alice holds a third of the pool while mallory has steps in db2");
$node->safe_psql('postgres', 'DROP DATABASE db2 WITH (FORCE)');
$until = time + 90;
sleep(0.2) while offered_to('alice') < 10 && time < $until;
is(offered_to('alice'), '10', "db2 dropped, its offers are freed: alice's share is half the pool");

done_testing();
