--
-- first_week: what a team met in its first week with dwarf (issue 23).  A
-- fresh server's flow ids are small; a failed flow's outcome, snapshot,
-- list row and history name the task that failed and its SQLSTATE, detail
-- and hint; every function that takes a flow id raises one "does not
-- exist" error for an id the caller cannot see; purge deletes the caller's
-- own flows unless all_roles says otherwise; maintain's dry run changes
-- nothing, and its "now" is no longer an argument; await_all and await_any
-- wait for many flows in one call; list shows interrupt payloads and takes
-- page_size; the retry policy retries 40001 by default and P0001 only when
-- listed; schema dwarf holds the API and nothing else: the helpers are in
-- dwarf_internal, which only dwarf's own functions reach.
--
\set VERBOSITY terse
CREATE SCHEMA fw;
GRANT USAGE ON SCHEMA fw TO PUBLIC;

-- Runs a statement; 'ok', or its error with its SQLSTATE and hint.
CREATE FUNCTION fw.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	hint text;
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
	RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' HINT: ' || nullif(hint, ''), '');
END $$;

CREATE FUNCTION fw.ok(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"ok": true}'::jsonb $$;
CREATE FUNCTION fw.charge(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'card % declined', s->>'card'
		USING ERRCODE = '22023', DETAIL = 'The issuer said no.', HINT = 'Try another card.';
END $$;
CREATE FUNCTION fw.refund(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('refunded', s->'onErr'->>'task') $$;
CREATE FUNCTION fw.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	answer jsonb := dwarf.interrupt(jsonb_build_object('question', 'approve order ' || (s->>'order') || '?'));
BEGIN
	RETURN CASE WHEN answer IS NULL THEN '{}' ELSE jsonb_build_object('approved', answer) END;
END $$;
CREATE FUNCTION fw.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep('1 hour');
	RETURN '{}';
END $$;
-- raises s.code on its first two attempts (counted by the flow's retry rows)
CREATE FUNCTION fw.flaky(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	n int := 1 + (SELECT count(*) FROM dwarf.step WHERE flow_id = dwarf.flow_id() AND status = 'retry');
BEGIN
	IF n <= 2 THEN
		RAISE EXCEPTION 'attempt % failed', n USING ERRCODE = s->>'code';
	END IF;
	RETURN jsonb_build_object('attempt', n);
END $$;

SELECT dwarf.define('fw_ok', '{"tasks": {"A": "fw.ok"}}') > 0 AS defined;
SELECT dwarf.define('fw_checkout', '{"tasks": {"Reserve": "fw.ok", "Charge": "fw.charge"},
  "transitions": [{"from": "Reserve", "to": "Charge"}]}') > 0 AS defined;
SELECT dwarf.define('fw_handled', '{"tasks": {"Charge": "fw.charge", "Refund": "fw.refund"},
  "transitions": [{"from": "Charge", "to": "Refund", "on_error": true}]}') > 0 AS defined;
SELECT dwarf.define('fw_approval', '{"tasks": {"Ask": "fw.ask"}}') > 0 AS defined;
SELECT dwarf.define('fw_nap', '{"tasks": {"Nap": "fw.nap", "After": "fw.ok"},
  "transitions": [{"from": "Nap", "to": "After"}]}') > 0 AS defined;
SELECT dwarf.define('fw_retry', '{"tasks": {"Pay": {"function": "fw.flaky",
  "retry": {"attempts": 3, "initial": "10 ms"}}}}') > 0 AS defined;
SELECT dwarf.define('fw_retry_listed', '{"tasks": {"Pay": {"function": "fw.flaky",
  "retry": {"attempts": 3, "initial": "10 ms", "on": ["P0001"]}}}}') > 0 AS defined;

----------------------------------------------------------------------
-- small ids: a server never promoted (timeline 1) has epoch 0 in bits
-- 40 to 47, so its ids are the sequence's values
----------------------------------------------------------------------
SELECT dwarf.create('fw_ok', '{}') AS first_id \gset
SELECT :first_id < 4294967296 AS below_2_32, (:first_id >> 40) & 255 AS epoch,
	   (:first_id >> 48) AS shard, timeline_id AS timeline
  FROM pg_control_checkpoint();
SELECT status FROM dwarf.await(:first_id, '30 s');

----------------------------------------------------------------------
-- a failure names its task and SQLSTATE, wherever it is read
----------------------------------------------------------------------
SELECT status, error, error_task, error_sqlstate, error_detail, error_hint
  FROM dwarf.run('fw_checkout', '{"card": "4242"}');
SELECT dwarf.create('fw_checkout', '{"card": "1111"}') AS failed_id \gset
SELECT status, error, error_task, error_sqlstate, error_detail, error_hint
  FROM dwarf.await(:failed_id, '30 s');
SELECT status, error, error_task, error_sqlstate, error_detail, error_hint
  FROM dwarf.snapshot(:failed_id);
SELECT error, error_task, error_sqlstate, error_detail, error_hint
  FROM dwarf.list(graph => 'fw_checkout', status => 'failed') ORDER BY flow_id;
SELECT task, status, error, error_sqlstate, error_detail, error_hint
  FROM dwarf.history(:failed_id);
SELECT task, status, error_sqlstate FROM dwarf.history(:failed_id) WHERE task = 'Charge';
-- a completed flow has none, even when a handler took its failed step
SELECT status, state->'refunded' AS refunded, error, error_task, error_sqlstate
  FROM dwarf.run('fw_handled', '{"card": "7"}');
SELECT status, error, error_task, error_sqlstate FROM dwarf.run('fw_ok', '{}');

----------------------------------------------------------------------
-- "not found" is one error for every function that takes a flow id
----------------------------------------------------------------------
SELECT f AS call, fw.try('SELECT * FROM ' || f) AS error
  FROM unnest(ARRAY['dwarf.history(999999999)', 'dwarf.snapshot(999999999)',
					'dwarf.await(999999999, ''0'')', 'dwarf.cancel(999999999)',
					'dwarf.resume(999999999)', 'dwarf.delete(999999999)',
					'dwarf.continue(999999999)', 'dwarf.state_at(999999999)',
					'dwarf.replay_state(999999999)', 'dwarf.state_at(999999999, 5)',
					'dwarf.history_mermaid(999999999)', 'dwarf.await_all(''{999999999}'', ''0'')',
					'dwarf.await_any(''{999999999}'', ''0'')', 'dwarf.check_flow(999999999)']) f;
-- the hint says what the id tells: another shard, another server's timeline
SELECT fw.try('SELECT * FROM dwarf.history(' || ((5::bigint << 48) + 17) || ')') AS other_shard;
SELECT fw.try('SELECT * FROM dwarf.snapshot(' || ((1::bigint << 40) + 17) || ')') AS later_timeline;
-- cancel of a closed flow returns false, of a running one true
SELECT dwarf.cancel(:first_id) AS cancelled_completed;
SELECT dwarf.create('fw_nap', '{}') AS nap_id \gset

----------------------------------------------------------------------
-- waiting for many flows in one call
----------------------------------------------------------------------
SELECT array_agg(dwarf.create('fw_ok', jsonb_build_object('n', i)) ORDER BY i DESC) AS many
  FROM generate_series(1, 50) i \gset
SELECT count(*) AS outcomes, bool_and(a.status = 'completed') AS all_completed,
	   array_agg(a.flow_id ORDER BY a.ordinality) = :'many'::bigint[] AS in_order
  FROM dwarf.await_all(:'many'::bigint[], '60 s') WITH ORDINALITY a;
SELECT count(*) AS none FROM dwarf.await_all('{}', '0');
-- one unknown id among them is the not-found error
SELECT fw.try('SELECT * FROM dwarf.await_all(''{' || :first_id || ', 999999999}'', ''0'')') AS unknown_among;
-- await_any: the flow that closes, not the one asleep for an hour
SELECT dwarf.create('fw_ok', '{}') AS quick_id \gset
SELECT flow_id = :quick_id AS the_quick_one, status
  FROM dwarf.await_any(ARRAY[:nap_id, :quick_id], '30 s');
-- past its timeout, the first flow as it is
SELECT flow_id = :nap_id AS the_first, status FROM dwarf.await_any(ARRAY[:nap_id], '0');
SELECT dwarf.cancel(:nap_id) AS cancelled_running, dwarf.cancel(:nap_id) AS cancelled_again;

-- an approval inbox: list returns the payloads, a page at a time
SELECT array_agg(dwarf.create('fw_approval', jsonb_build_object('order', i))) AS asking
  FROM generate_series(1, 12) i \gset
SELECT count(*) AS parked FROM dwarf.await_all(:'asking'::bigint[], '60 s') WHERE status = 'interrupted';
SELECT count(*) AS page, count(interrupt_payload) AS with_payload,
	   min(interrupt_payload->>'question') AS a_question
  FROM dwarf.list(graph => 'fw_approval', status => 'interrupted', page_size => 10);
SELECT fw.try('SELECT * FROM dwarf.list("limit" => 5)') AS limit_is_gone;

----------------------------------------------------------------------
-- purge: the caller's own flows, unless all_roles
----------------------------------------------------------------------
CREATE ROLE regress_dwarf_fw_a NOLOGIN;
CREATE ROLE regress_dwarf_fw_b NOLOGIN;
GRANT regress_dwarf_fw_b TO regress_dwarf_fw_a;
GRANT USAGE ON SCHEMA dwarf TO regress_dwarf_fw_a, regress_dwarf_fw_b;
SET ROLE regress_dwarf_fw_b;
SELECT dwarf.define('fw_mine', '{"tasks": {"A": "fw.ok"}}') > 0 AS defined;
SELECT status FROM dwarf.run('fw_mine', '{}');
SELECT status FROM dwarf.run('fw_mine', '{}');
RESET ROLE;
SET ROLE regress_dwarf_fw_a;
SELECT dwarf.define('fw_mine', '{"tasks": {"A": "fw.ok"}}') > 0 AS defined;
SELECT status FROM dwarf.run('fw_mine', '{}');
-- a has b's privileges: it sees b's flows, and another role's id is not found
SELECT owner, count(*) FROM dwarf.flow GROUP BY owner ORDER BY owner::text;
SELECT regexp_replace(fw.try('SELECT * FROM dwarf.history(' || :first_id || ')'), 'flow \d+', 'flow N')
	AS superusers_flow;
RESET ROLE;
-- a superuser's default purge leaves the other roles' flows
BEGIN;
SELECT dwarf.purge('0 s') >= 1 AS purged_own;
SELECT owner, count(*) FROM dwarf.flow
 WHERE owner IN ('regress_dwarf_fw_a'::regrole, 'regress_dwarf_fw_b'::regrole)
 GROUP BY owner ORDER BY owner::text;
ROLLBACK;
SET ROLE regress_dwarf_fw_a;
SELECT dwarf.purge('0 s') AS purged_own;
SELECT owner, count(*) FROM dwarf.flow GROUP BY owner ORDER BY owner::text;
SELECT dwarf.purge('0 s', all_roles => true) AS purged_all_roles;
SELECT count(*) AS left FROM dwarf.flow;
RESET ROLE;

----------------------------------------------------------------------
-- maintain: a dry run changes nothing; "now" is not its argument
----------------------------------------------------------------------
SELECT (SELECT count(*) FROM dwarf.flow) AS live_before,
	   (SELECT count(*) FROM dwarf.flow_archive) AS archived_before,
	   (SELECT count(*) FROM dwarf.maintain_log) AS log_before,
	   (SELECT count(*) FROM pg_inherits WHERE inhparent = 'dwarf.flow_archive'::regclass) AS days_before \gset
SET dwarf.archive_after = '0';
SELECT (r->>'dry_run')::boolean AS dry_run, (r->>'moved_flows')::int >= 20 AS would_move,
	   r ? 'segments_archived' AS says_segments, r ? 'days_made' AS says_days
  FROM dwarf.maintain(dry_run => true) r;
RESET dwarf.archive_after;
SELECT (SELECT count(*) FROM dwarf.flow) = :live_before AS live_same,
	   (SELECT count(*) FROM dwarf.flow_archive) = :archived_before AS archive_same,
	   (SELECT count(*) FROM dwarf.maintain_log) = :log_before AS no_log_row,
	   (SELECT count(*) FROM pg_inherits WHERE inhparent = 'dwarf.flow_archive'::regclass) = :days_before
		 AS no_day_made;
SELECT fw.try($$SELECT dwarf.maintain(now => now() + interval '40 days')$$) AS now_is_gone;
SELECT has_function_privilege('regress_dwarf_fw_a', 'dwarf_internal.maintain_at(timestamptz, boolean)', 'EXECUTE')
	AS others_may_maintain_at;

----------------------------------------------------------------------
-- the retry target: 40001 twice, then done on attempt 3; P0001 is not
-- retried unless the policy lists it
----------------------------------------------------------------------
SELECT status, state->'attempt' AS attempt FROM dwarf.run('fw_retry', '{"code": "40001"}', timeout => '60 s');
SELECT status, error, error_task, error_sqlstate
  FROM dwarf.run('fw_retry', '{"code": "P0001"}', timeout => '60 s');
SELECT flow_id AS listed_id, status, state->'attempt' AS attempt
  FROM dwarf.run('fw_retry_listed', '{"code": "P0001"}', timeout => '60 s') \gset
SELECT :'status' AS status, :attempt AS attempt;
SELECT task, status, attempt, error, error_sqlstate FROM dwarf.history(:listed_id);

----------------------------------------------------------------------
-- the surface: schema dwarf holds what README's function table lists,
-- one name per concept (dwarf.step is the table of step rows; the steps
-- of one task are history's rows WHERE task = ...); the helpers are in
-- dwarf_internal, out of every role's reach but dwarf's own functions'
----------------------------------------------------------------------
WITH api(name) AS (
	VALUES ('await'), ('await_all'), ('await_any'), ('baggage'), ('cancel'), ('check_flow'),
		   ('claim'), ('complete'), ('continue'), ('create'), ('define'), ('delete'),
		   ('drop_limit'), ('extend'), ('external_steps'), ('fail'), ('flow_id'), ('fork'),
		   ('goto'), ('history'), ('history_mermaid'), ('http_call'), ('interrupt'),
		   ('limit_counts'), ('list'), ('maintain'), ('new_incarnation'), ('purge'),
		   ('replay_state'), ('resume'), ('retry'), ('run'), ('set_limit'), ('sleep'),
		   ('snapshot'), ('state_at'), ('stats_histogram'), ('stats_reset'), ('step_key'),
		   ('subgraph'), ('validate'), ('worker_stats')),
	 have AS (SELECT proname::text AS name FROM pg_proc WHERE pronamespace = 'dwarf'::regnamespace)
SELECT (SELECT array_agg(name ORDER BY name) FROM have WHERE name NOT IN (SELECT name FROM api))
		 AS not_in_the_table,
	   (SELECT array_agg(name ORDER BY name) FROM api WHERE name NOT IN (SELECT name FROM have))
		 AS missing;
SELECT to_regprocedure('dwarf.step(bigint, text)') IS NULL AS no_step_function,
	   to_regclass('dwarf.step') IS NOT NULL AS step_table;
SELECT p.proname, has_function_privilege('regress_dwarf_fw_a', p.oid, 'EXECUTE') AS executable
  FROM pg_proc p WHERE p.pronamespace = 'dwarf_internal'::regnamespace ORDER BY 1;
SELECT has_schema_privilege('regress_dwarf_fw_a', 'dwarf_internal', 'USAGE') AS others_use_internal;
-- a role reaches none of them itself, and every function that uses them
-- works for it, on its own flows (snapshot, list and await of a failed one)
SET ROLE regress_dwarf_fw_a;
SELECT fw.try($$SELECT dwarf_internal.fold_changes('{}', '{}', '{}')$$) AS fold_changes;
SELECT fw.try('SELECT * FROM dwarf_internal.flow_steps(1)') AS flow_steps;
SELECT dwarf.define('fw_own_checkout', '{"tasks": {"Reserve": "fw.ok", "Charge": "fw.charge"},
  "transitions": [{"from": "Reserve", "to": "Charge"}]}') > 0 AS defined;
SELECT dwarf.create('fw_own_checkout', '{"card": "5"}') AS own_failed_id \gset
SELECT status, error_task, error_sqlstate, error_hint FROM dwarf.await(:own_failed_id, '30 s');
SELECT status, state, steps, error_task, error_sqlstate FROM dwarf.snapshot(:own_failed_id);
SELECT task, status, error_sqlstate FROM dwarf.history(:own_failed_id);
SELECT dwarf.state_at(:own_failed_id) AS state_at, dwarf.replay_state(:own_failed_id) AS replay_state,
	   dwarf.state_at(:own_failed_id, (SELECT step_id FROM dwarf.history(:own_failed_id) WHERE task = 'Charge'))
		 AS before_charge;
SELECT status, error_task, error_sqlstate FROM dwarf.list(graph => 'fw_own_checkout');
SELECT dwarf.history_mermaid(:own_failed_id) LIKE '%Charge<br/>failed%' AS mermaid;
SELECT archive_days >= 0 AS storage_readable FROM dwarf.storage;
SELECT dwarf.purge('0 s') AS purged_own;
RESET ROLE;

-- the interrupted approvals, cancelled
SELECT count(*) FILTER (WHERE dwarf.cancel(id)) AS cancelled FROM unnest(:'asking'::bigint[]) id;
DELETE FROM dwarf.graph WHERE owner IN ('regress_dwarf_fw_a'::regrole, 'regress_dwarf_fw_b'::regrole);
DROP OWNED BY regress_dwarf_fw_a, regress_dwarf_fw_b;
DROP ROLE regress_dwarf_fw_a, regress_dwarf_fw_b;
