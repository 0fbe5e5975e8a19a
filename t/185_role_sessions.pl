# Copyright: dwarf project.
#
# 185_role_sessions.pl: a worker's session is never shared between roles.
# With one worker, every flow of every role runs in the same process.
#
#  1. alice's task plants, in her session, what a session holds beyond a
#     step: an open cursor over her table, an open large object, a dblink
#     named connection (made with her password), a custom setting and a
#     nextval of her sequence, and a pg_temp function (a security-restricted
#     operation refuses temporary tables only): it is dropped when her step
#     ends, so each of her steps makes it afresh.
#  2. bob's flows, a chain of three probing steps, see none of it: not while
#     alice's flows run interleaved with his, not after they completed.
#     Inside his tasks session_user and current_user are bob, is_superuser is
#     off, his role-level settings apply (the database-specific one winning
#     over the role-wide one), and lastval() raises, in the later steps of a
#     chain too (dwarf's own nextvals do not show through).
#  3. A worker that loaded a library (dblink) or gained a custom setting for
#     one role is replaced before it serves another, and the task that did
#     it runs in runners from then on: alice's and bob's flows of a second
#     round still complete, and no task marks the worker again.  A task that
#     leaves only a custom setting defined marks it too, and bob's tasks
#     interleaved with it read that setting as NULL.
#  4. A superuser's flow sees is_superuser on: the owner's, not the worker's.
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
my $node = new_node('role_sessions', 'dwarf.workers' => 1, max_connections => 40);
my $host = $node->host;
my $port = $node->port;

# Flows of each role per round.
my $N = 8;

# alice logs in with a password (dblink lets a role that is not a superuser
# connect only with one), everyone else as before.
$node->safe_psql('postgres', q{
SET password_encryption = 'scram-sha-256';
CREATE ROLE alice LOGIN PASSWORD 'alice-pw';
CREATE ROLE bob LOGIN;
});
my $hba = slurp_file($node->data_dir . '/pg_hba.conf');
open my $fh, '>', $node->data_dir . '/pg_hba.conf' or die "pg_hba.conf: $!";
print $fh "local all alice scram-sha-256\n$hba";
close $fh;
$node->reload;
# The reload takes effect when the postmaster gets to it: wait for it.
my $refused = 0;
for (1 .. $PostgreSQL::Test::Utils::timeout_default)
{
	my ($rc) = $node->psql('postgres', 'SELECT 1', extra_params => [ '-U', 'alice', '-w' ]);
	last if ($refused = $rc != 0);
	sleep 1;
}
ok($refused, 'alice cannot log in without her password');

$node->safe_psql('postgres', q{
CREATE EXTENSION dwarf;
CREATE EXTENSION dblink;
GRANT USAGE ON SCHEMA dwarf TO alice, bob;
CREATE SCHEMA alice AUTHORIZATION alice;
CREATE SCHEMA bob AUTHORIZATION bob;
ALTER ROLE bob SET app.greeting = 'hello';
ALTER ROLE bob SET work_mem = '5MB';
ALTER ROLE bob IN DATABASE postgres SET work_mem = '7MB';
});
wait_for_workers($node, 'the worker runs', count => 1);

# ---------------------------------------------------------------- alice
# Each plant in a block of its own: "plant" records true for what took, the
# error for what was refused.  An earlier step of hers in the same
# transaction may hold the cursor name, and one in the same process the
# dblink connection: both are hers, and reused or named apart.
$node->safe_psql('postgres', qq{
SET ROLE alice;
CREATE TABLE alice.secrets (v text);
INSERT INTO alice.secrets VALUES ('alice-row-1'), ('alice-row-2');
CREATE SEQUENCE alice.seq;
CREATE FUNCTION alice.plant(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
DECLARE
	got jsonb := '{}';
	cur refcursor := 'alice_cur';
	fd int;
BEGIN
	BEGIN
		BEGIN
			OPEN cur FOR SELECT v FROM alice.secrets;
		EXCEPTION WHEN duplicate_cursor THEN
			cur := 'alice_cur_' || dwarf.flow_id();
			OPEN cur FOR SELECT v FROM alice.secrets;
		END;
		got := got || '{"cursor": true}';
	EXCEPTION WHEN others THEN
		got := got || jsonb_build_object('cursor', SQLERRM);
	END;
	BEGIN
		fd := pg_catalog.lo_open(pg_catalog.lo_create(0), 393216);	-- INV_READ | INV_WRITE
		PERFORM pg_catalog.lowrite(fd, '\\x616c6963652d6c6f'::bytea);
		PERFORM pg_catalog.lo_lseek(fd, 0, 0);
		got := got || jsonb_build_object('lo', true, 'lo_fd', fd);
	EXCEPTION WHEN others THEN
		got := got || jsonb_build_object('lo', SQLERRM);
	END;
	BEGIN
		IF NOT coalesce('alice_conn' = ANY (public.dblink_get_connections()), false) THEN
			PERFORM public.dblink_connect('alice_conn',
				'host=$host port=$port dbname=postgres user=alice password=alice-pw');
		END IF;
		got := got || jsonb_build_object('dblink',
			(SELECT n FROM public.dblink('alice_conn', 'SELECT count(*) FROM alice.secrets') AS t(n bigint)) = 2);
	EXCEPTION WHEN others THEN
		got := got || jsonb_build_object('dblink', SQLERRM);
	END;
	BEGIN
		CREATE FUNCTION pg_temp.f() RETURNS text LANGUAGE sql AS 'SELECT ''alice''''s code''';
		got := got || '{"pg_temp": true}';
	EXCEPTION WHEN others THEN
		got := got || jsonb_build_object('pg_temp', SQLERRM);
	END;
	BEGIN
		PERFORM pg_catalog.set_config('alice.secret', 's3cret', false);
		got := got || jsonb_build_object('setting', pg_catalog.current_setting('alice.secret') = 's3cret');
	EXCEPTION WHEN others THEN
		got := got || jsonb_build_object('setting', SQLERRM);
	END;
	BEGIN
		got := got || jsonb_build_object('nextval', pg_catalog.nextval('alice.seq') > 0);
	EXCEPTION WHEN others THEN
		got := got || jsonb_build_object('nextval', SQLERRM);
	END;
	RETURN jsonb_build_object('plant', got);
END \$\$;
SELECT dwarf.define('plant', '{"tasks": {"P": "alice.plant"}}');
});

# ---------------------------------------------------------------- bob
# Each probe in a block of its own; an error is recorded as its SQLSTATE (or
# "refused").  The first step also probes dblink (loading it).
$node->safe_psql('postgres', q{
SET ROLE bob;
CREATE FUNCTION bob.probe(tag text, far boolean) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	saw jsonb := '{}';
	cur refcursor := 'alice_cur';
	v text;
	reads int := 0;
BEGIN
	BEGIN
		FETCH cur INTO v;
		saw := saw || jsonb_build_object('fetch', coalesce(v, 'no row'));
	EXCEPTION WHEN others THEN
		saw := saw || jsonb_build_object('fetch', SQLSTATE);
	END;
	saw := saw || jsonb_build_object('alice_cursors',
		(SELECT count(*) FROM pg_catalog.pg_cursors WHERE name LIKE 'alice%'));
	FOR fd IN 0..63 LOOP
		BEGIN
			PERFORM pg_catalog.loread(fd, 10);
			reads := reads + 1;
		EXCEPTION WHEN others THEN
			NULL;
		END;
	END LOOP;
	saw := saw || jsonb_build_object('loreads', reads);
	IF far THEN
		saw := saw || jsonb_build_object('dblink_connections',
			pg_catalog.to_jsonb(public.dblink_get_connections()));
		BEGIN
			saw := saw || jsonb_build_object('dblink_query',
				(SELECT n FROM public.dblink('alice_conn', 'SELECT count(*) FROM alice.secrets') AS t(n bigint)));
		EXCEPTION WHEN others THEN
			saw := saw || jsonb_build_object('dblink_query', 'refused');
		END;
	END IF;
	BEGIN
		saw := saw || jsonb_build_object('pg_temp_f', pg_temp.f());
	EXCEPTION WHEN others THEN
		saw := saw || jsonb_build_object('pg_temp_f', 'refused');
	END;
	saw := saw || jsonb_build_object('alice_secret_null',
		pg_catalog.current_setting('alice.secret', true) IS NULL);
	BEGIN
		saw := saw || jsonb_build_object('lastval', pg_catalog.lastval());
	EXCEPTION WHEN others THEN
		saw := saw || jsonb_build_object('lastval', SQLSTATE);
	END;
	RETURN jsonb_build_object(tag, saw || jsonb_build_object(
		'session_user', session_user,
		'current_user', current_user,
		'is_superuser', pg_catalog.current_setting('is_superuser'),
		'greeting', pg_catalog.current_setting('app.greeting', true),
		'work_mem', pg_catalog.current_setting('work_mem')));
END $$;
CREATE FUNCTION bob.p1(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT bob.probe('p1', true) $$;
CREATE FUNCTION bob.p2(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT bob.probe('p2', false) $$;
CREATE FUNCTION bob.p3(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT bob.probe('p3', false) $$;
SELECT dwarf.define('probe', '{"tasks": {"p1": "bob.p1", "p2": "bob.p2", "p3": "bob.p3"},
  "transitions": [{"chain": ["p1", "p2", "p3", "END"]}]}');
});

# What bob's steps must see: nothing of alice's, and himself.
my $seen = q{"fetch": "34000", "alice_cursors": 0, "loreads": 0, "pg_temp_f": "refused",
  "alice_secret_null": true, "lastval": "55000", "session_user": "bob", "current_user": "bob",
  "is_superuser": "off", "greeting": "hello", "work_mem": "7MB"};
my $expect_bob = qq{{"p1": {$seen, "dblink_connections": null, "dblink_query": "refused"},
  "p2": {$seen}, "p3": {$seen}}};
my $expect_alice = q{{"cursor": true, "lo": true, "dblink": true, "setting": true, "nextval": true}};

# create_round($round, $alice, $bob): in one transaction, $alice flows of
# alice's and $bob of bob's, interleaved, each with input {"round": $round}.
sub create_round
{
	my ($round, $alice, $bob) = @_;
	my $sql = "BEGIN;\n";
	for my $i (1 .. ($alice > $bob ? $alice : $bob))
	{
		$sql .= "SET ROLE alice; SELECT dwarf.create('plant', '{\"round\": \"$round\"}');\n"
		  if $i <= $alice;
		$sql .= "SET ROLE bob; SELECT dwarf.create('probe', '{\"round\": \"$round\"}');\n"
		  if $i <= $bob;
	}
	$node->safe_psql('postgres', $sql . "COMMIT;\n");
}

# check_round($round, $alice, $bob): every flow of the round completed,
# alice's plants took (but pg_temp), and every bob step saw what it should.
sub check_round
{
	my ($round, $alice, $bob) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	wait_flows_closed($node, 'postgres', "round $round: every flow closes");
	is( $node->safe_psql('postgres', qq{
SELECT owner || ' ' || status || ' ' || count(*) FROM dwarf.flow
 WHERE input->>'round' = '$round' GROUP BY owner, status ORDER BY 1}),
		join("\n", ($alice ? "alice completed $alice" : ()), ($bob ? "bob completed $bob" : ())),
		"round $round: every flow completed");
	if ($alice)
	{
		is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM dwarf.flow
 WHERE owner = 'alice'::regrole AND input->>'round' = '$round'
   AND (state->'plant') - 'lo_fd' - 'pg_temp' = '$expect_alice'}),
			$alice,
			"round $round: alice's cursor, large object, dblink connection, setting and nextval took")
		  or diag $node->safe_psql('postgres', qq{
SELECT id, status, error, state->'plant' FROM dwarf.flow
 WHERE owner = 'alice'::regrole AND input->>'round' = '$round' LIMIT 3});
		# A temporary function is allowed (a restricted operation refuses
		# temporary tables only) and dropped when its step ends: each of
		# alice's steps makes its own, none finds an earlier one.
		is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM dwarf.flow
 WHERE owner = 'alice'::regrole AND input->>'round' = '$round'
   AND state->'plant'->'pg_temp' = 'true'}),
			$alice,
			"round $round: alice's pg_temp function was made afresh in every flow (none outlived its step)");
		note $node->safe_psql('postgres', qq{
SELECT 'alice: ' || (state->'plant'->>'pg_temp') || ', descriptors ' || string_agg(state->'plant'->>'lo_fd', ' ')
  FROM dwarf.flow WHERE owner = 'alice'::regrole AND input->>'round' = '$round'
 GROUP BY state->'plant'->>'pg_temp'});
	}
	if ($bob)
	{
		is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM dwarf.flow
 WHERE owner = 'bob'::regrole AND input->>'round' = '$round'
   AND state - 'round' = '$expect_bob'}),
			$bob,
			"round $round: every step of every bob flow saw nothing of alice's session, and himself")
		  or diag $node->safe_psql('postgres', qq{
SELECT e.tag || '.' || k.key || ': ' || count(*) || ' flows saw ' || min(coalesce(f.state->e.tag->k.key, 'null')::text)
  FROM dwarf.flow f, jsonb_each('$expect_bob') e(tag, v), jsonb_each(e.v) k(key, want)
 WHERE f.owner = 'bob'::regrole AND f.input->>'round' = '$round'
   AND f.state->e.tag->k.key IS DISTINCT FROM k.want
 GROUP BY e.tag, k.key ORDER BY 1});
	}
}

# replaced(): the lines of the server log that say a worker is or will be
# replaced (not the statements the test sent, which the log shows too).
sub replaced
{
	return grep { /worker/ && /replaced/ && !/statement:/ }
	  split /\n/, slurp_file($node->logfile);
}

# ---------------------------------------------------------------- 1, 2a: interleaved
create_round('1', $N, $N);
check_round('1', $N, $N);

# ---------------------------------------------------------------- 2b: after alice's
create_round('1b', 0, $N);
check_round('1b', 0, $N);
my @replaced1 = replaced();
note "rounds 1 and 1b: the server log says\n", join("\n", @replaced1);

# ---------------------------------------------------------------- 3: once more
# The worker loaded dblink for alice (and for bob's first step), and gained
# alice.secret: it was marked to be replaced before it serves another role,
# and replaced when it would have.  A bound that does not depend on the
# number of flows: each of the two tasks that load dblink marks a worker
# once (then its steps go to runners), and each mark costs a line that says
# so and one when the worker exits.
cmp_ok(scalar @replaced1, '>=', 1, 'the server log says the worker that loaded dblink for one role is replaced');
cmp_ok(scalar @replaced1, '<=', 4, 'at most twice for each of the two tasks that loaded it');
wait_for_workers($node, 'the launcher started the worker again', count => 1);

# Round 2 runs alice's task (and bob's) again: they complete, and no task
# marks the worker again, as their steps run in runners now.  The only
# line the round may add is the exit of a worker marked before it, when it
# met another role's steps first here (e.g. marked by bob's first step in
# round 1, it served only bob until alice's steps came).
create_round('2', $N, $N);
check_round('2', $N, $N);
my @replaced2 = replaced();
my @new = @replaced2[ scalar @replaced1 .. $#replaced2 ];
cmp_ok(scalar @new, '<=', 1,
	'the second round did not mark the worker again: the tasks that loaded dblink ran in runners')
  or diag join("\n", @new);
is(scalar(grep { /task "(P|p1)"/ } @new), 0, 'no line of the second round names a task that loaded dblink')
  or diag join("\n", @new);

# ---------------------------------------------------------------- 3b: a setting alone
# A task that loads no library but leaves a custom setting defined (as ''
# for everyone after it) marks the worker too: bob's tasks, interleaved
# with it, read that setting as NULL, as in a session of his own.
$node->safe_psql('postgres', q{
SET ROLE alice;
CREATE FUNCTION alice.set_only(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT pg_catalog.jsonb_build_object('set', pg_catalog.set_config('alice.only', 'x', false)) $$;
SELECT dwarf.define('set_only', '{"tasks": {"S": "alice.set_only"}}');
SET ROLE bob;
CREATE FUNCTION bob.look(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT pg_catalog.jsonb_build_object('only_null', pg_catalog.current_setting('alice.only', true) IS NULL,
		'session_user', session_user) $$;
SELECT dwarf.define('look', '{"tasks": {"L": "bob.look"}}');
});
my $sql = "BEGIN;\n";
$sql .= "SET ROLE alice; SELECT dwarf.create('set_only', '{\"round\": \"3\"}');\n"
  . "SET ROLE bob; SELECT dwarf.create('look', '{\"round\": \"3\"}');\n"
  for 1 .. $N;
$node->safe_psql('postgres', $sql . "COMMIT;\n");
wait_flows_closed($node, 'postgres', 'round 3: every flow closes');
is( $node->safe_psql('postgres', q{
SELECT owner || ' ' || count(*) FILTER (WHERE status = 'completed' AND state->>'set' = 'x') || ' '
       || count(*) FILTER (WHERE status = 'completed' AND state - 'round' = '{"only_null": true, "session_user": "bob"}')
  FROM dwarf.flow WHERE input->>'round' = '3' GROUP BY owner ORDER BY 1}),
	"alice $N 0\nbob 0 $N",
	"round 3: alice's tasks set alice.only; bob's, interleaved, read it as NULL");
my @replaced3 = replaced();
my @new3 = @replaced3[ scalar @replaced2 .. $#replaced3 ];
ok(@new3 >= 1 && @new3 <= 2,
	'the server log says the worker is replaced for the task that left a custom setting (a mark, an exit)')
  or diag join("\n", @new3);

# ---------------------------------------------------------------- 4: superuser
my $su = $node->safe_psql('postgres', 'SELECT current_user');
$node->safe_psql('postgres', q{
CREATE FUNCTION public.who(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT pg_catalog.jsonb_build_object('session_user', session_user, 'current_user', current_user,
		'is_superuser', pg_catalog.current_setting('is_superuser')) $$;
SELECT dwarf.define('who', '{"tasks": {"W": "public.who"}}');
});
my ($status, $who) = split /\|/, $node->safe_psql('postgres',
	q{SELECT status, state FROM dwarf.run('who', '{}', timeout => '60 s')});
is($status, 'completed', "a superuser's flow completes");
is( $node->safe_psql('postgres', qq{
SELECT '$who'::jsonb = jsonb_build_object('is_superuser', 'on', 'current_user', '$su', 'session_user', '$su')}),
	't', "a superuser's flow runs as that superuser, with is_superuser on")
  or diag $who;

check_no_crash($node, 'no process crashed');
stop_node($node, $t0);
done_testing();
