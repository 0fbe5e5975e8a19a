# Copyright: dwarf project.
#
# 181_retry_policy_restart.pl: a step that a task's retry policy retries
# after an error is rebuilt from its rows, so a server that stops in the
# backoff carries on where it was: the next attempt has the next number, the
# attempts used before the stop count against the policy's, give_up_after
# still counts from the first attempt, and the retried attempts left the
# state as it was.
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
my $node = new_node('retry_restart');

# app.flaky raises a serialization failure on every attempt; its attempt
# number is one more than its flow's retry rows so far.
$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE SCHEMA app;
CREATE FUNCTION app.flaky(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	n int := 1 + (SELECT count(*) FROM dwarf.step WHERE flow_id = dwarf.flow_id() AND status = 'retry');
BEGIN
	RAISE EXCEPTION 'attempt % failed', n USING ERRCODE = '40001';
END $$;
SELECT dwarf.define('three', '{"tasks": {"A": {"function": "app.flaky",
  "retry": {"attempts": 3, "initial": "3 s", "factor": 1}}}}');
SELECT dwarf.define('give_up', '{"tasks": {"A": {"function": "app.flaky",
  "retry": {"attempts": 10, "initial": "3 s", "factor": 1, "give_up_after": "4 s"}}}}');
});

my $three   = $node->safe_psql('postgres', q{SELECT dwarf.create('three', '{"x": 1}')});
my $give_up = $node->safe_psql('postgres', q{SELECT dwarf.create('give_up', '{"x": 2}')});
for my $id ($three, $give_up)
{
	ok( $node->poll_query_until('postgres',
			"SELECT count(*) = 1 FROM dwarf.step WHERE flow_id = $id AND status = 'retry'"),
		"flow ${id}'s first attempt failed and is retried");
}
# the stop comes within the 3 s backoff of both
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM dwarf.step WHERE flow_id IN ($three, $give_up)"),
	'2', 'neither has taken its second attempt');

$node->stop('immediate');
start_after_immediate_stop($node, 'the server starts again, from an immediate stop');
wait_for_workers($node, 'the workers are back');

is( $node->safe_psql('postgres',
		"SELECT status || ': ' || error || ' ' || state::text FROM dwarf.await($three, '60 s')"),
	'failed: attempt 3 failed {"x": 1}',
	'the three attempts end in a failure, with the input state');
is( $node->safe_psql('postgres',
		"SELECT string_agg(status || ' ' || attempt || ' ' || (error->>'sqlstate')"
		  . " || ' ' || coalesce(changes::text, 'none'), ', ' ORDER BY step_id)"
		  . " FROM dwarf.step WHERE flow_id = $three"),
	'retry 1 40001 none, retry 2 40001 none, failed 3 40001 none',
	'one row per attempt, numbered on across the restart');
is( $node->safe_psql('postgres',
		"SELECT bool_and(b.started_at >= a.wake_at) FROM dwarf.step a JOIN dwarf.step b"
		  . " ON b.flow_id = a.flow_id AND b.attempt = a.attempt + 1 WHERE a.flow_id = $three"),
	't', 'each attempt waited for its backoff');

# The second attempt starts 3 s after the first; a third would start 6 s
# after it, past give_up_after (4 s), counted from the first attempt, not
# from the first one after the restart.
is( $node->safe_psql('postgres',
		"SELECT status || ': ' || error FROM dwarf.await($give_up, '60 s')"),
	'failed: attempt 2 failed', 'give_up_after ends the retries after the second attempt');
is( $node->safe_psql('postgres',
		"SELECT string_agg(status || ' ' || attempt, ', ' ORDER BY step_id)"
		  . " FROM dwarf.step WHERE flow_id = $give_up"),
	'retry 1, failed 2', 'its rows');

check_no_crash($node, 'no crash');
stop_node($node, $t0);
done_testing();
