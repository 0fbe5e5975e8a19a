--
-- chain_waits: a chain (a step's ready successors run in the step's
-- transaction) that reaches something that makes the flow wait: a
-- dwarf.retry backoff, a dwarf.interrupt, a dwarf.subgraph child; a fan-in
-- reached from branches of different lengths; goto and on_error edges.
--
-- Every task writes one row per run to cw.log (primary key: a second write
-- of the same run would fail its step), saying how many of its flow's rows
-- it could see and how many of them its own transaction wrote.  A row it
-- sees that another transaction wrote was committed before it ran; one its
-- own transaction wrote commits together with it.  So "every task sees all
-- its predecessors' rows" is the README's guarantee, a step's effects
-- commit together with its predecessor's or after them, checked from the
-- inside; and a task that runs after a wait sees none of its own
-- transaction's: the wait ended the chain.  Commit counts and times vary
-- with the machine: only booleans about them are printed.
--
\set VERBOSITY terse
CREATE SCHEMA cw;
CREATE TABLE cw.log (
	id		bigserial,					-- the order the runs wrote in
	flow_id	bigint,
	task	text,
	n		int,						-- the task's nth run in its flow
	txn		xid8 DEFAULT pg_current_xact_id(),
	seen	int,						-- the flow's rows visible to the run
	mine	int,						-- ... of which its own transaction wrote
	PRIMARY KEY (flow_id, task, n));

-- Records a run of a task; returns its nth run in this flow.
CREATE FUNCTION cw.rec(task text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE n int;
BEGIN
	INSERT INTO cw.log (flow_id, task, n, seen, mine)
	SELECT dwarf.flow_id(), rec.task,
		   1 + count(*) FILTER (WHERE l.task = rec.task),
		   count(*), count(*) FILTER (WHERE l.txn = pg_current_xact_id())
	  FROM cw.log l WHERE l.flow_id = dwarf.flow_id()
	RETURNING cw.log.n INTO n;
	RETURN n;
END $$;

-- Plain tasks: record the run, append the task's name to the trail.
DO $$
DECLARE t text;
BEGIN
	FOREACH t IN ARRAY ARRAY['A', 'B', 'C', 'D', 'E', 'B1', 'B2a', 'B2b', 'B3a', 'B3b',
							 'B3c', 'J', 'Z', 'K1', 'K2', 'K3', 'N', 'X', 'H'] LOOP
		EXECUTE format('CREATE FUNCTION cw.%I(s jsonb) RETURNS jsonb LANGUAGE sql '
					   'AS $f$ SELECT jsonb_build_object(''trail'', %L, ''n'', cw.rec(%L)) $f$',
					   lower(t), t, t);
	END LOOP;
END $$;

-- Retried once, after a 500 ms backoff.
CREATE FUNCTION cw.retry(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := cw.rec('R');
BEGIN
	IF n = 1 AND dwarf.retry('500 ms', 1, '500 ms') THEN
		RETURN jsonb_build_object('trail', 'R', 'tries', n);
	END IF;
	RETURN jsonb_build_object('trail', 'R', 'tries', n);
END $$;
-- Asks, and parks until resumed.
CREATE FUNCTION cw.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := cw.rec('Ask'); d jsonb;
BEGIN
	d := dwarf.interrupt(jsonb_build_object('ask', 'go on?', 'run', n));
	IF d IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('trail', 'Ask', 'answer', d);
END $$;
-- Waits for a child flow of cw_child.
CREATE FUNCTION cw.call(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := cw.rec('Call'); r jsonb;
BEGIN
	r := dwarf.subgraph('cw_child', jsonb_build_object('x', 21));
	IF r IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('trail', 'Call', 'child', r);
END $$;
-- Jumps to X by its goto edge.
CREATE FUNCTION cw.jump(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM cw.rec('G');
	PERFORM dwarf.goto('X');
	RETURN '{"trail": "G"}';
END $$;
-- Writes, then raises: its write rolls back with it.
CREATE FUNCTION cw.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM cw.rec('F');
	RAISE EXCEPTION 'F fails';
END $$;
-- The handler: records the error it was given.
CREATE FUNCTION cw.handle(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('trail', 'H', 'n', cw.rec('H'), 'handled', s->'onErr'->>'message',
							  'failed_task', s->'onErr'->>'task') $$;

-- The commits a flow's steps took: the distinct transactions of its rows.
CREATE FUNCTION cw.commits(flow bigint) RETURNS bigint LANGUAGE sql AS $$
	SELECT count(DISTINCT txn) FROM cw.log WHERE flow_id = flow $$;
-- A flow's runs in the order they wrote, as "task/n".
CREATE FUNCTION cw.runs(flow bigint) RETURNS text LANGUAGE sql AS $$
	SELECT string_agg(task || '/' || n, ' ' ORDER BY id) FROM cw.log WHERE flow_id = flow $$;
-- Each run saw every row of its flow written before it (commit order follows
-- run order) and no row's transaction is older than the row before it.
CREATE FUNCTION cw.ordered(flow bigint) RETURNS boolean LANGUAGE sql AS $$
	SELECT bool_and(seen = before AND txn >= coalesce(prev, txn))
	  FROM (SELECT seen, txn, count(*) OVER w - 1 AS before,
				   lag(txn) OVER w AS prev
			  FROM cw.log WHERE flow_id = flow
			WINDOW w AS (ORDER BY id ROWS UNBOUNDED PRECEDING)) x $$;
-- Each run's write committed in the transaction of its step row, and each
-- step row that a run of the task wrote (not a failed one, whose write
-- rolled back, nor the row dwarf.resume wrote) has its write.
CREATE FUNCTION cw.with_its_step(flow bigint) RETURNS boolean LANGUAGE sql AS $$
	SELECT bool_and(s.x IS NOT NULL AND l.txn IS NOT NULL
					AND s.x = l.txn::text::bigint % 4294967296)
	  FROM (SELECT u.task, l.xmin::text::bigint AS x,
				   row_number() OVER (PARTITION BY u.task ORDER BY u.step_id) AS n
			  FROM dwarf.step_log l, unnest(l.step_id, l.task, l.status) u(step_id, task, status)
			 WHERE l.flow_id = flow AND u.status NOT IN ('failed', 'resumed')) s
	  FULL JOIN (SELECT * FROM cw.log WHERE flow_id = flow) l USING (task, n) $$;
-- The step rows of a flow, in order.
CREATE FUNCTION cw.steps(flow bigint) RETURNS TABLE (task text, status text, attempt int)
	LANGUAGE sql AS $$ SELECT task, status, attempt FROM dwarf.history(flow) ORDER BY step_id $$;

CREATE TABLE cw.runs (name text PRIMARY KEY, flow_id bigint);

----------------------------------------------------------------------
-- (a) a chain that reaches a retry backoff
----------------------------------------------------------------------
SELECT dwarf.define('cw_retry', '{"tasks": {"A": "cw.a", "R": "cw.retry", "C": "cw.c", "D": "cw.d"},
  "transitions": [{"chain": ["A", "R", "C", "D", "END"]}], "reducers": {"trail": "append"}}');
INSERT INTO cw.runs SELECT 'retry', flow_id FROM dwarf.run('cw_retry', '{}');
SELECT flow_id AS retry_id FROM cw.runs WHERE name = 'retry' \gset
SELECT status, state->'trail' AS trail, state->'tries' AS tries FROM dwarf.await(:retry_id, '30 s');
SELECT * FROM cw.steps(:retry_id);
-- every run wrote once; the retried run saw both earlier rows committed
-- (none of them its own transaction's): the backoff ended the chain
SELECT task, n, seen, mine = 0 AS none_mine FROM cw.log
 WHERE flow_id = :retry_id AND task = 'R' AND n = 2;
SELECT cw.runs(:retry_id) AS runs, cw.ordered(:retry_id) AS ordered,
	   cw.commits(:retry_id) BETWEEN 2 AND 4 AS two_to_four_commits;
-- the second attempt started no sooner than its backoff after the first
SELECT b.started_at >= a.finished_at + interval '500 ms' AS waited_backoff
  FROM (SELECT * FROM dwarf.history(:retry_id) WHERE task = 'R') a JOIN (SELECT * FROM dwarf.history(:retry_id) WHERE task = 'R') b ON b.attempt = a.attempt + 1;

----------------------------------------------------------------------
-- (b) a chain that reaches an interrupt
----------------------------------------------------------------------
SELECT dwarf.define('cw_ask', '{"tasks": {"A": "cw.a", "B": "cw.b", "Ask": "cw.ask", "C": "cw.c",
  "D": "cw.d", "E": "cw.e"},
  "transitions": [{"chain": ["A", "B", "Ask", "C", "D", "E", "END"]}], "reducers": {"trail": "append"}}');
INSERT INTO cw.runs SELECT 'ask', flow_id FROM dwarf.run('cw_ask', '{}');
SELECT flow_id AS ask_id FROM cw.runs WHERE name = 'ask' \gset
-- parked: what ran before the interrupt is committed, in the history, with
-- its writes; the state is the state at the interrupt
SELECT status, state->'trail' AS trail, interrupt_payload FROM dwarf.await(:ask_id, '30 s');
SELECT status, state->'trail' AS trail FROM dwarf.snapshot(:ask_id);
SELECT * FROM cw.steps(:ask_id);
SELECT cw.runs(:ask_id) AS runs, cw.ordered(:ask_id) AS ordered,
	   cw.commits(:ask_id) <= 2 AS one_or_two_commits;
-- resumed: the task runs again, in a transaction of its own, and the chain
-- after it completes in one or two commits
SELECT dwarf.resume(:ask_id, '{"ok": true}');
SELECT status, state->'trail' AS trail, state->'answer' AS answer FROM dwarf.await(:ask_id, '30 s');
SELECT * FROM cw.steps(:ask_id);
SELECT task, n, seen, mine = 0 AS none_mine FROM cw.log
 WHERE flow_id = :ask_id AND task = 'Ask' AND n = 2;
SELECT cw.runs(:ask_id) AS runs, cw.ordered(:ask_id) AS ordered,
	   (SELECT count(DISTINCT txn) <= 2 FROM cw.log l
		 WHERE l.flow_id = :ask_id AND l.id >= (SELECT id FROM cw.log WHERE flow_id = :ask_id
												  AND task = 'Ask' AND n = 2)) AS resumed_chain_in_one_or_two;

----------------------------------------------------------------------
-- (c) a chain that reaches a subgraph wait
----------------------------------------------------------------------
SELECT dwarf.define('cw_child', '{"tasks": {"K1": "cw.k1", "K2": "cw.k2", "K3": "cw.k3"},
  "transitions": [{"chain": ["K1", "K2", "K3", "END"]}], "reducers": {"trail": "append"}}');
SELECT dwarf.define('cw_parent', '{"tasks": {"A": "cw.a", "Call": "cw.call", "C": "cw.c", "D": "cw.d"},
  "transitions": [{"chain": ["A", "Call", "C", "D", "END"]}], "reducers": {"trail": "append"}}');
INSERT INTO cw.runs SELECT 'parent', flow_id FROM dwarf.run('cw_parent', '{}');
SELECT flow_id AS parent_id FROM cw.runs WHERE name = 'parent' \gset
SELECT status, state->'trail' AS trail, state->'child'->'trail' AS child_trail,
	   state->'child'->'x' AS child_x FROM dwarf.await(:parent_id, '30 s');
SELECT id AS child_id FROM dwarf.flow WHERE parent_id = :parent_id \gset
INSERT INTO cw.runs VALUES ('child', :child_id);
SELECT status, state->'trail' AS trail FROM dwarf.flow WHERE id = :child_id;
SELECT * FROM cw.steps(:parent_id);
SELECT * FROM cw.steps(:child_id);
SELECT cw.runs(:parent_id) AS parent_runs, cw.runs(:child_id) AS child_runs,
	   cw.ordered(:parent_id) AS parent_ordered, cw.ordered(:child_id) AS child_ordered;
-- the child's chain: one or two commits, after the parent's first run of
-- Call committed; Call ran again after the whole child had committed (it saw
-- every child row), and in a transaction of its own
SELECT cw.commits(:child_id) <= 2 AS child_one_or_two_commits,
	   (SELECT min(txn) FROM cw.log WHERE flow_id = :child_id) >
	   (SELECT txn FROM cw.log WHERE flow_id = :parent_id AND task = 'Call' AND n = 1) AS child_after_call,
	   (SELECT mine = 0 FROM cw.log WHERE flow_id = :parent_id AND task = 'Call' AND n = 2) AS call_alone,
	   (SELECT txn FROM cw.log WHERE flow_id = :parent_id AND task = 'Call' AND n = 2) >
	   (SELECT max(txn) FROM cw.log WHERE flow_id = :child_id) AS call_after_child,
	   cw.commits(:parent_id) BETWEEN 2 AND 4 AS parent_two_to_four_commits;

----------------------------------------------------------------------
-- (d) a fan-in reached from branches of different lengths
----------------------------------------------------------------------
SELECT dwarf.define('cw_fan', '{"tasks": {"A": "cw.a", "B1": "cw.b1", "B2a": "cw.b2a", "B2b": "cw.b2b",
  "B3a": "cw.b3a", "B3b": "cw.b3b", "B3c": "cw.b3c", "J": "cw.j", "Z": "cw.z"},
  "transitions": [{"from": "A", "to": ["B1", "B2a", "B3a"]}, {"from": "B1", "to": "J"},
    {"chain": ["B2a", "B2b", "J"]}, {"chain": ["B3a", "B3b", "B3c", "J"]},
    {"chain": ["J", "Z", "END"]}],
  "fan_in": ["J"], "reducers": {"trail": "append"}}');
INSERT INTO cw.runs SELECT 'fan', flow_id FROM dwarf.run('cw_fan', '{}');
SELECT flow_id AS fan_id FROM cw.runs WHERE name = 'fan' \gset
SELECT status, state->'trail' AS trail FROM dwarf.await(:fan_id, '30 s');
-- one step row and one write per task; the fan-in ran once, after every
-- branch (it saw all seven rows before it), and Z after it
SELECT task, count(*) AS steps FROM dwarf.history(:fan_id) GROUP BY task ORDER BY task;
SELECT task, n, seen FROM cw.log WHERE flow_id = :fan_id AND task IN ('A', 'J', 'Z') ORDER BY id;
-- each branch task saw A and its own branch's earlier rows; no branch row
-- is of a later transaction than J's
SELECT count(*) AS writes, cw.commits(:fan_id) <= 2 AS one_or_two_commits,
	   bool_and(l.seen >= v.least_seen) AS saw_predecessors,
	   bool_and(l.txn <= (SELECT txn FROM cw.log WHERE flow_id = :fan_id AND task = 'J'))
		 FILTER (WHERE l.task <> 'Z') AS none_after_j
  FROM cw.log l
  JOIN (VALUES ('A', 0), ('B1', 1), ('B2a', 1), ('B2b', 2), ('B3a', 1), ('B3b', 2), ('B3c', 3),
			   ('J', 7), ('Z', 8)) v (task, least_seen) USING (task)
 WHERE l.flow_id = :fan_id;

----------------------------------------------------------------------
-- (e) goto and on_error edges within a chain
----------------------------------------------------------------------
-- A -> G, which jumps to X (not N); X -> F, which fails; its on_error edge
-- leads to H.
SELECT dwarf.define('cw_edges', '{"tasks": {"A": "cw.a", "G": "cw.jump", "N": "cw.n", "X": "cw.x",
  "F": "cw.boom", "H": "cw.handle"},
  "transitions": [{"from": "A", "to": "G"}, {"from": "G", "to": "N"},
    {"from": "G", "to": "X", "goto": true}, {"from": "X", "to": "F"},
    {"from": "F", "to": "H", "on_error": true}, {"from": "H", "to": "END"}],
  "reducers": {"trail": "append"}}');
INSERT INTO cw.runs SELECT 'edges', flow_id FROM dwarf.run('cw_edges', '{}');
SELECT flow_id AS edges_id FROM cw.runs WHERE name = 'edges' \gset
SELECT status, state->'trail' AS trail, state->'handled' AS handled,
	   state->'failed_task' AS failed_task, error FROM dwarf.await(:edges_id, '30 s');
SELECT * FROM cw.steps(:edges_id);
-- N never ran; F's write rolled back with it; the others wrote once, each
-- seeing all the rows before it
SELECT cw.runs(:edges_id) AS runs, cw.ordered(:edges_id) AS ordered,
	   cw.commits(:edges_id) <= 2 AS one_or_two_commits;

----------------------------------------------------------------------
-- every flow of this file: completed, each run's write there once and
-- committed with its step row, in run order (the fan's branches need not
-- see each other's rows: it was checked above)
----------------------------------------------------------------------
SELECT r.name, f.status, f.error IS NULL AS no_error,
	   (SELECT count(*) FROM cw.log l WHERE l.flow_id = f.id) AS writes,
	   cw.with_its_step(f.id) AS with_its_step,
	   r.name = 'fan' OR cw.ordered(f.id) AS ordered
  FROM cw.runs r JOIN dwarf.flow f ON f.id = r.flow_id ORDER BY r.name;

DROP SCHEMA cw CASCADE;
