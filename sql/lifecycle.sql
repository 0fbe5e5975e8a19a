--
-- lifecycle: the options of create and run (priority, fairness_key and
-- fairness_weight, time_budget, delete_on_completion, thread) and the
-- operations on flows: continue, fork, delete, cancel, list and
-- history_mermaid, with bad input.  Orders are checked with the database's
-- own step timestamps, never with a timer in the test.
--
\set VERBOSITY terse
CREATE SCHEMA lc;

-- Runs a statement; returns 'ok' or its error, with flow and step ids masked.
CREATE FUNCTION lc.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '(flow|step) -?\d+', '\1 N', 'g');
END $$;

-- Each task appends its name to "trail" and records the "v" it saw.
CREATE FUNCTION lc.a(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('trail', 'A', 'a_saw', s->'v') $$;
CREATE FUNCTION lc.b(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF coalesce(s->>'fail_b', '') <> '' THEN
		RAISE EXCEPTION 'lc boom %', s->>'fail_b';
	END IF;
	RETURN jsonb_build_object('trail', 'B', 'b_saw', s->'v');
END $$;
CREATE FUNCTION lc.c(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('trail', 'C', 'c_saw', s->'v') $$;
SELECT dwarf.define('lc_chain', '{"tasks": {"A": "lc.a", "B": "lc.b", "C": "lc.c"},
  "transitions": [{"chain": ["A", "B", "C", "END"]}],
  "reducers": {"trail": "append"}}');
-- A flow that waits a while without holding a worker.
CREATE FUNCTION lc.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep(coalesce(s->>'nap', '2 s')::interval);
	RETURN '{"napped": true}';
END $$;
SELECT dwarf.define('lc_nap', '{"tasks": {"Nap": "lc.nap", "C": "lc.c"},
  "transitions": [{"from": "Nap", "to": "C"}]}');

----------------------------------------------------------------------
-- priority is strict: 50 flows at priority 10 and then 10 at priority 1,
-- created in one transaction; every priority-1 flow is done before any
-- priority-10 flow's second step starts
----------------------------------------------------------------------
CREATE FUNCTION lc.work(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(0.01);
	RETURN '{}';
END $$;
SELECT dwarf.define('lc_prio', '{"tasks": {"First": "lc.work", "Second": "lc.work"},
  "transitions": [{"from": "First", "to": "Second"}]}');
BEGIN;
SELECT count(dwarf.create('lc_prio', jsonb_build_object('i', i), priority => 10)) AS low
  FROM generate_series(1, 50) i;
SELECT count(dwarf.create('lc_prio', jsonb_build_object('i', i), priority => 1)) AS high
  FROM generate_series(1, 10) i;
COMMIT;
SELECT f.priority, o.status, count(*)
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id, LATERAL dwarf.await(f.id, '60 s') o
 WHERE g.name = 'lc_prio' GROUP BY 1, 2 ORDER BY 1, 2;
SELECT f.priority, s.task, count(*)
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id JOIN dwarf.step s ON s.flow_id = f.id
 WHERE g.name = 'lc_prio' GROUP BY 1, 2 ORDER BY 1, 2;
SELECT (SELECT max(s.finished_at) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		  JOIN dwarf.step s ON s.flow_id = f.id WHERE g.name = 'lc_prio' AND f.priority = 1)
	<= (SELECT min(s.started_at) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		  JOIN dwarf.step s ON s.flow_id = f.id
		 WHERE g.name = 'lc_prio' AND f.priority = 10 AND s.task = 'Second')
	AS priority_1_done_before_any_priority_10_second_step;

----------------------------------------------------------------------
-- fairness_key and fairness_weight are accepted and stored
----------------------------------------------------------------------
SELECT flow_id AS fair_id FROM dwarf.run('lc_chain', '{"v": 1}', fairness_key => 'tenant-a', fairness_weight => 3) \gset
SELECT status FROM dwarf.await(:fair_id, '30 s');
SELECT dwarf.create('lc_chain', '{"v": 1}', fairness_key => 'tenant-b') AS fair2_id \gset
SELECT status FROM dwarf.await(:fair2_id, '30 s');
SELECT fairness_key, fairness_weight FROM dwarf.flow WHERE id IN (:fair_id, :fair2_id) ORDER BY id;
-- a weight must be at least 1
SELECT lc.try('SELECT dwarf.create(''lc_chain'', ''{}'', fairness_key => ''t'', fairness_weight => 0)');
SELECT lc.try('SELECT dwarf.create(''lc_chain'', ''{}'', fairness_weight => -1)');
SELECT lc.try('SELECT dwarf.run(''lc_chain'', ''{}'', fairness_key => ''t'', fairness_weight => 0)');
SELECT lc.try('SELECT dwarf.create(''lc_chain'', ''{}'', fairness_weight => 10001)');
SELECT count(*) AS flows_with_bad_weights FROM dwarf.flow WHERE fairness_key = 't' OR fairness_weight NOT IN (1, 3);

----------------------------------------------------------------------
-- time_budget: a step running past it is stopped and fails
----------------------------------------------------------------------
CREATE FUNCTION lc.slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep((s->>'secs')::float8);
	RETURN jsonb_build_object('trail', 'Slow');
END $$;
SELECT dwarf.define('lc_slow', '{"tasks": {"A": "lc.a", "Slow": "lc.slow", "S2": "lc.slow", "S3": "lc.slow"},
  "transitions": [{"chain": ["A", "Slow", "S2", "S3", "END"]}],
  "reducers": {"trail": "append"}}');
SELECT flow_id AS tb_id FROM dwarf.run('lc_slow', '{"secs": 2}', time_budget => '200 ms') \gset
SELECT status, error ILIKE '%time budget%' AS mentions_time_budget, error FROM dwarf.await(:tb_id, '30 s');
SELECT task, status, attempt, error ILIKE '%time budget%' AS mentions_time_budget FROM dwarf.history(:tb_id);
-- it was stopped, not left to finish its 2 s
SELECT finished_at - started_at < '1.5 s' AS stopped_early FROM dwarf.history(:tb_id) WHERE task = 'Slow';
SELECT time_budget FROM dwarf.flow WHERE id = :tb_id;
-- the budget is per step: three steps of 100 ms each fit a 1 s budget
SELECT status, state->'trail' AS trail FROM dwarf.run('lc_slow', '{"secs": 0.1}', time_budget => '1 s');
-- the workers go on serving other flows
SELECT status, state FROM dwarf.run('lc_chain', '{"v": 0}');
-- a budget must be positive
SELECT lc.try('SELECT dwarf.create(''lc_slow'', ''{}'', time_budget => ''0 s'')');
SELECT lc.try('SELECT dwarf.run(''lc_slow'', ''{}'', time_budget => ''-1 s'')');

----------------------------------------------------------------------
-- delete_on_completion
----------------------------------------------------------------------
-- the flow and its steps are deleted by the transaction that completes it:
-- run reports completed, but no state is left to return
SELECT flow_id AS doc_id, status AS doc_status, coalesce(state::text, 'NULL') AS doc_state
  FROM dwarf.run('lc_chain', '{"v": 5}', delete_on_completion => true) \gset
SELECT :'doc_status' AS status, :'doc_state' AS state;
SELECT count(*) AS flow_rows FROM dwarf.flow WHERE id = :doc_id;
SELECT count(*) AS step_rows FROM dwarf.step WHERE flow_id = :doc_id;
-- a failed flow is kept for inspection
SELECT flow_id AS docf_id FROM dwarf.run('lc_chain', '{"v": 5, "fail_b": "kept"}', delete_on_completion => true) \gset
SELECT status, error FROM dwarf.await(:docf_id, '30 s');
SELECT status, delete_on_completion FROM dwarf.flow WHERE id = :docf_id;

----------------------------------------------------------------------
-- thread and dwarf.continue
----------------------------------------------------------------------
CREATE FUNCTION lc.inc(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1, 'turns', 1) $$;
SELECT dwarf.define('lc_counter', '{"tasks": {"Inc": "lc.inc"}, "reducers": {"turns": "add"}}');
SELECT flow_id AS t1_id FROM dwarf.run('lc_counter', '{"n": 10}', thread => 'lc-thread-1') \gset
SELECT status, state FROM dwarf.await(:t1_id, '30 s');
-- the next flow starts from the previous final state, with the input merged in
SELECT dwarf.continue(:t1_id, '{"said": "again"}') AS t2_id \gset
SELECT status, state FROM dwarf.await(:t2_id, '30 s');
SELECT dwarf.continue(:t2_id, '{"n": 100}') AS t3_id \gset
SELECT status, state FROM dwarf.await(:t3_id, '30 s');
SELECT id = :t1_id AS first, id = :t2_id AS second, id = :t3_id AS third, thread, input
  FROM dwarf.flow WHERE thread = 'lc-thread-1' ORDER BY id;
-- the next flow runs the graph's latest version
SELECT dwarf.define('lc_counter', '{"tasks": {"Inc": "lc.inc", "C": "lc.c"},
  "transitions": [{"from": "Inc", "to": "C"}], "reducers": {"turns": "add"}}');
SELECT dwarf.continue(:t3_id) AS t4_id \gset
SELECT status, state FROM dwarf.await(:t4_id, '30 s');
SELECT g.version FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE f.id IN (:t3_id, :t4_id) ORDER BY f.id;
-- a flow made without a thread gets one when it is continued; both share it
SELECT flow_id AS u1_id FROM dwarf.run('lc_counter', '{"n": 0}') \gset
SELECT dwarf.continue(:u1_id) AS u2_id \gset
SELECT status, state->'n' AS n FROM dwarf.await(:u2_id, '30 s');
SELECT count(DISTINCT thread) AS threads, bool_and(thread IS NOT NULL) AS has_thread
  FROM dwarf.flow WHERE id IN (:u1_id, :u2_id);
-- a failed flow can be continued from its state; the input is merged as
-- changes are: JSON null removes a field
SELECT flow_id AS cf_id FROM dwarf.run('lc_chain', '{"v": 7, "fail_b": "once"}', thread => 'lc-thread-2') \gset
SELECT status, state FROM dwarf.await(:cf_id, '30 s');
SELECT dwarf.continue(:cf_id, '{"fail_b": null, "v": 8}') AS cf2_id \gset
SELECT status, state - 'fail_b' AS state, state ? 'fail_b' AS has_fail_b FROM dwarf.await(:cf2_id, '30 s');
-- continue of a running or interrupted flow is an error naming its status
SELECT dwarf.create('lc_nap', '{"nap": "1 s"}', thread => 'lc-thread-3') AS run_id \gset
SELECT lc.try(format('SELECT dwarf.continue(%s, %L)', :run_id, '{}'));
SELECT status FROM dwarf.await(:run_id, '30 s');
CREATE FUNCTION lc.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE d jsonb := dwarf.interrupt('{"ask": "lc"}');
BEGIN
	IF d IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('answer', d);
END $$;
SELECT dwarf.define('lc_ask', '{"tasks": {"Ask": "lc.ask"}}');
SELECT flow_id AS ask_id FROM dwarf.run('lc_ask', '{}') \gset
SELECT status FROM dwarf.await(:ask_id, '30 s');
SELECT lc.try(format('SELECT dwarf.continue(%s, %L)', :ask_id, '{}'));
SELECT dwarf.resume(:ask_id, '"fine"');
SELECT status, state FROM dwarf.await(:ask_id, '30 s');
-- unknown flow, bad input
SELECT lc.try('SELECT dwarf.continue(-1, ''{}'')');
SELECT lc.try(format('SELECT dwarf.continue(%s, %L)', :t1_id, '[1]'));
SELECT lc.try(format('SELECT dwarf.continue(%s, NULL)', :t1_id));
SELECT count(*) AS flows_in_thread_1 FROM dwarf.flow WHERE thread = 'lc-thread-1';

----------------------------------------------------------------------
-- dwarf.fork: a new flow restarting at a step, from the state that step saw
----------------------------------------------------------------------
SELECT flow_id AS src_id FROM dwarf.run('lc_chain', '{"v": 1}') \gset
SELECT status, state FROM dwarf.await(:src_id, '30 s');
SELECT step_id AS b_step FROM dwarf.history(:src_id) WHERE task = 'B' \gset
SELECT dwarf.fork(:b_step, '{"v": 2}') AS fork_id \gset
SELECT status, state FROM dwarf.await(:fork_id, '30 s');
-- its history starts with that task
SELECT task, status, attempt FROM dwarf.history(:fork_id);
SELECT start_task, input FROM dwarf.flow WHERE id = :fork_id;
-- the source flow is untouched
SELECT status, state FROM dwarf.snapshot(:src_id);
-- fork from the first step, without overrides: the whole flow again
SELECT step_id AS a_step FROM dwarf.history(:src_id) WHERE task = 'A' \gset
SELECT dwarf.fork(:a_step) AS fork2_id \gset
SELECT status, state FROM dwarf.await(:fork2_id, '30 s');
-- fork the failed step of a failed flow with the fix as override
SELECT flow_id AS bad_id FROM dwarf.run('lc_chain', '{"v": 3, "fail_b": "in source"}') \gset
SELECT status, error FROM dwarf.await(:bad_id, '30 s');
SELECT step_id AS bad_step FROM dwarf.history(:bad_id) WHERE task = 'B' \gset
SELECT dwarf.fork(:bad_step, '{"fail_b": null}') AS fork3_id \gset
SELECT status, state - 'fail_b' AS state, state ? 'fail_b' AS has_fail_b FROM dwarf.await(:fork3_id, '30 s');
SELECT task, status FROM dwarf.history(:fork3_id);
-- bad input
SELECT lc.try('SELECT dwarf.fork(-1, ''{}'')');
SELECT lc.try(format('SELECT dwarf.fork(%s, %L)', :b_step, '[1]'));
SELECT lc.try(format('SELECT dwarf.fork(%s, NULL)', :b_step));
SELECT lc.try('SELECT dwarf.fork(NULL, ''{}'')');

----------------------------------------------------------------------
-- dwarf.delete
----------------------------------------------------------------------
SELECT dwarf.delete(:src_id);
SELECT count(*) AS flow_rows, (SELECT count(*) FROM dwarf.step WHERE flow_id = :src_id) AS step_rows
  FROM dwarf.flow WHERE id = :src_id;
-- the forks are other flows: still there
SELECT count(*) AS forks_left FROM dwarf.flow WHERE id IN (:fork_id, :fork2_id);
-- a running (sleeping) flow can be deleted; it then runs no further step
SELECT dwarf.create('lc_nap', '{"nap": "500 ms"}') AS del_id \gset
SELECT status FROM dwarf.await(:del_id, '100 ms');
SELECT dwarf.delete(:del_id);
SELECT pg_sleep(1);
SELECT count(*) AS flow_rows, (SELECT count(*) FROM dwarf.step WHERE flow_id = :del_id) AS step_rows
  FROM dwarf.flow WHERE id = :del_id;
SELECT lc.try(format('SELECT dwarf.await(%s, %L)', :del_id, '1 s'));
SELECT lc.try(format('SELECT dwarf.delete(%s)', :del_id));
SELECT dwarf.delete(NULL);
-- the workers are fine
SELECT status, state FROM dwarf.run('lc_chain', '{"v": 9}');

----------------------------------------------------------------------
-- dwarf.cancel
----------------------------------------------------------------------
SELECT dwarf.create('lc_nap', '{"nap": "2 s"}') AS cn_id \gset
SELECT dwarf.cancel(:cn_id, 'no longer needed');
SELECT status, cancel_reason, error FROM dwarf.await(:cn_id, '30 s');
SELECT status, cancel_reason FROM dwarf.flow WHERE id = :cn_id;
-- a closed flow is not cancelled again: false, and it keeps its reason
SELECT dwarf.cancel(:cn_id, 'again') AS cancelled;
SELECT dwarf.cancel(:bad_id) AS cancelled;
SELECT dwarf.cancel(:fork_id) AS cancelled;
SELECT lc.try('SELECT dwarf.cancel(-1)');
SELECT status, cancel_reason FROM dwarf.flow WHERE id = :cn_id;

----------------------------------------------------------------------
-- dwarf.list: filters, newest first, keyset paging
----------------------------------------------------------------------
CREATE FUNCTION lc.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
SELECT dwarf.define('lc_list_a', '{"tasks": {"A": "lc.a", "B": "lc.b"}, "transitions": [{"from": "A", "to": "B"}]}');
SELECT dwarf.define('lc_list_b', '{"tasks": {"N": "lc.noop"}}');
CREATE TABLE lc.made (n int PRIMARY KEY, flow_id bigint);
INSERT INTO lc.made
SELECT i, (dwarf.run(CASE WHEN i % 3 = 0 THEN 'lc_list_b' ELSE 'lc_list_a' END,
					 CASE WHEN i IN (4, 8) THEN jsonb_build_object('fail_b', 'list ' || i) ELSE '{}' END,
					 thread => CASE WHEN i % 2 = 0 THEN 'lc-even' END)).flow_id
  FROM generate_series(1, 9) i;
-- flows made later have larger ids
SELECT bool_and(a.flow_id < b.flow_id) AS ids_grow FROM lc.made a JOIN lc.made b ON b.n = a.n + 1;
-- by graph, newest first
SELECT m.n, l.graph, l.version, l.status, l.thread, l.error, l.finished_at >= l.created_at AS finished
  FROM dwarf.list(graph => 'lc_list_a') WITH ORDINALITY l(flow_id, graph, version, status, thread, error, created_at, finished_at, interrupt_payload, error_task, error_sqlstate, error_detail, error_hint, ord)
  JOIN lc.made m ON m.flow_id = l.flow_id
 ORDER BY l.ord;
SELECT array_agg(m.n ORDER BY ord) AS newest_first
  FROM dwarf.list(graph => 'lc_list_b') WITH ORDINALITY l(flow_id, graph, version, status, thread, error, created_at, finished_at, interrupt_payload, error_task, error_sqlstate, error_detail, error_hint, ord)
  JOIN lc.made m ON m.flow_id = l.flow_id;
-- by status, thread, error
SELECT array_agg(m.n ORDER BY m.n DESC) AS failed
  FROM dwarf.list(status => 'failed') l JOIN lc.made m ON m.flow_id = l.flow_id;
SELECT count(*) AS failed_outside_made FROM dwarf.list(status => 'failed', graph => 'lc_list_a') l
 WHERE l.flow_id NOT IN (SELECT flow_id FROM lc.made);
SELECT array_agg(m.n ORDER BY ord) AS even_thread
  FROM dwarf.list(thread => 'lc-even') WITH ORDINALITY l(flow_id, graph, version, status, thread, error, created_at, finished_at, interrupt_payload, error_task, error_sqlstate, error_detail, error_hint, ord)
  JOIN lc.made m ON m.flow_id = l.flow_id;
SELECT array_agg(m.n ORDER BY ord) AS error_like
  FROM dwarf.list(error_like => '%LIST 8%') WITH ORDINALITY l(flow_id, graph, version, status, thread, error, created_at, finished_at, interrupt_payload, error_task, error_sqlstate, error_detail, error_hint, ord)
  JOIN lc.made m ON m.flow_id = l.flow_id;
SELECT count(*) AS nothing FROM dwarf.list(graph => 'lc_list_a', status => 'cancelled');
SELECT count(*) AS no_graph FROM dwarf.list(graph => 'lc_no_such_graph');
-- since/until bound created_at
SELECT count(*) AS since_now FROM dwarf.list(since => now() + '1 day');
SELECT count(*) = (SELECT count(*) FROM lc.made) AS until_tomorrow
  FROM dwarf.list(graph => NULL, until => now() + '1 day', page_size => 100000) l
 WHERE l.flow_id IN (SELECT flow_id FROM lc.made);
-- keyset paging: pages of 2 of the thread, each after the last id seen
SELECT l.flow_id AS p1_last FROM dwarf.list(thread => 'lc-even', page_size => 2) l ORDER BY l.flow_id LIMIT 1 \gset
SELECT array_agg(m.n ORDER BY l.flow_id DESC) AS page_1
  FROM dwarf.list(thread => 'lc-even', page_size => 2) l JOIN lc.made m ON m.flow_id = l.flow_id;
SELECT array_agg(m.n ORDER BY l.flow_id DESC) AS page_2
  FROM dwarf.list(thread => 'lc-even', before => :p1_last, page_size => 2) l JOIN lc.made m ON m.flow_id = l.flow_id;
SELECT l.flow_id AS p2_last FROM dwarf.list(thread => 'lc-even', before => :p1_last, page_size => 2) l ORDER BY l.flow_id LIMIT 1 \gset
SELECT count(*) AS page_3 FROM dwarf.list(thread => 'lc-even', before => :p2_last, page_size => 2);
SELECT count(*) AS limit_zero FROM dwarf.list(graph => 'lc_list_a', page_size => 0);

----------------------------------------------------------------------
-- dwarf.history_mermaid
----------------------------------------------------------------------
SELECT flow_id AS m1_id FROM dwarf.run('lc_chain', '{"v": 1}') \gset
SELECT dwarf.history_mermaid(:m1_id);
SELECT flow_id AS m2_id FROM dwarf.run('lc_chain', '{"v": 1, "fail_b": "mermaid"}') \gset
SELECT m LIKE 'flowchart%' AS is_flowchart,
	   m LIKE '%"A<br/>completed"]:::completed%' AS a_completed,
	   m LIKE '%"B<br/>failed"]:::failed%' AS b_failed,
	   m LIKE '%"C<br/>not run"]:::notrun%' AS c_not_run
  FROM dwarf.history_mermaid(:m2_id) m;
SELECT flow_id AS m3_id FROM dwarf.run('lc_ask', '{}') \gset
SELECT m LIKE '%"Ask<br/>interrupted"]:::interrupted%' AS ask_interrupted
  FROM dwarf.history_mermaid(:m3_id) m;
SELECT dwarf.resume(:m3_id, '1');
SELECT status FROM dwarf.await(:m3_id, '30 s');
SELECT lc.try('SELECT dwarf.history_mermaid(-1)');
SELECT dwarf.history_mermaid(NULL) IS NULL AS null_in_null_out;

-- nothing of ours is left running or parked; then delete our flows (the tests
-- that follow count flows)
SELECT f.status, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name LIKE 'lc\_%' AND f.status IN ('running', 'interrupted') GROUP BY 1;
SELECT count(*) > 0 AS deleted_some FROM (
	SELECT dwarf.delete(f.id) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE g.name LIKE 'lc\_%' AND f.parent_id IS NULL) d;
SELECT count(*) AS lc_flows_left FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name LIKE 'lc\_%';
DROP SCHEMA lc CASCADE;
