--
-- chaining: a step's ready successors run in the same transaction as the
-- step (bounded by dwarf.batch_size and dwarf.batch_time), so a short flow
-- commits once or twice, not once a step.  Each step still has its own row;
-- a successor sees its predecessor's writes; a failing step fails only its
-- own flow and its predecessors' writes stay, exactly once.
--
\set VERBOSITY terse
CREATE SCHEMA ch;
CREATE TABLE ch.log (flow_id bigint, task text, PRIMARY KEY (flow_id, task));
CREATE FUNCTION ch.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION ch.write(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ch.log VALUES (dwarf.flow_id(), coalesce(s->>'next', 'A'));
	RETURN jsonb_build_object('next', chr(ascii(coalesce(s->>'next', 'A')) + 1));
END $$;
-- Counts what the tasks before it wrote in this flow: they are visible to it.
CREATE FUNCTION ch.count(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('seen', count(*)) FROM ch.log WHERE flow_id = dwarf.flow_id() $$;
-- The same, STABLE: it reads through the snapshot it is given, so each step
-- of a batch needs one taken after its predecessor's writes.
CREATE FUNCTION ch.count_stable(s jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $$
	SELECT jsonb_build_object('seen', count(*)) FROM ch.log WHERE flow_id = dwarf.flow_id() $$;
CREATE FUNCTION ch.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ch.log VALUES (dwarf.flow_id(), 'boom');
	RAISE EXCEPTION 'third step fails';
END $$;
CREATE FUNCTION ch.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep('300 ms'); RETURN '{}'; END $$;

-- The commits a flow's steps took: the distinct transactions of its rows.
CREATE FUNCTION ch.commits(flow bigint) RETURNS bigint LANGUAGE sql AS $$
	SELECT count(DISTINCT xmin::text) FROM dwarf.step_log WHERE flow_id = flow $$;

SELECT dwarf.define('ch_ten', '{"tasks": {"A": "ch.noop", "B": "ch.noop", "C": "ch.noop",
  "D": "ch.noop", "E": "ch.noop", "F": "ch.noop", "G": "ch.noop", "H": "ch.noop",
  "I": "ch.noop", "J": "ch.noop"}, "transitions": [{"chain": ["A", "B", "C", "D", "E",
  "F", "G", "H", "I", "J"]}]}');
SELECT dwarf.define('ch_seen', '{"tasks": {"A": "ch.write", "B": "ch.write", "C": "ch.count"},
  "transitions": [{"chain": ["A", "B", "C"]}]}');
SELECT dwarf.define('ch_seen_stable', '{"tasks": {"A": "ch.write", "B": "ch.write",
  "C": "ch.count_stable"}, "transitions": [{"chain": ["A", "B", "C"]}]}');
SELECT dwarf.define('ch_fail', '{"tasks": {"A": "ch.write", "B": "ch.write", "C": "ch.boom",
  "D": "ch.noop"}, "transitions": [{"chain": ["A", "B", "C", "D"]}]}');
SELECT dwarf.define('ch_nap', '{"tasks": {"A": "ch.noop", "B": "ch.nap", "C": "ch.noop"},
  "transitions": [{"chain": ["A", "B", "C"]}]}');
SELECT dwarf.define('ch_fan', '{"tasks": {"A": "ch.noop", "B1": "ch.noop", "B2": "ch.noop",
  "B3": "ch.noop", "J": "ch.noop"}, "fan_in": ["J"],
  "transitions": [{"from": "A", "to": ["B1", "B2", "B3"]}, {"from": "B1", "to": "J"},
                  {"from": "B2", "to": "J"}, {"from": "B3", "to": "J"}]}');
CREATE TABLE ch.runs (name text, flow_id bigint, status text, state jsonb, error text);

-- Ten quick steps: one or two commits, ten step rows.
INSERT INTO ch.runs SELECT 'ten', flow_id, status, state, error FROM dwarf.run('ch_ten', '{}');
SELECT status, ch.commits(flow_id) <= 2 AS one_or_two_commits,
	   (SELECT count(*) FROM dwarf.step s WHERE s.flow_id = r.flow_id) AS steps
  FROM ch.runs r WHERE name = 'ten';

-- A successor sees its predecessors' writes.
INSERT INTO ch.runs SELECT 'seen', flow_id, status, state, error FROM dwarf.run('ch_seen', '{}');
SELECT status, state->'seen' AS seen FROM ch.runs WHERE name = 'seen';
INSERT INTO ch.runs SELECT 'seen_stable', flow_id, status, state, error
  FROM dwarf.run('ch_seen_stable', '{}');
SELECT status, state->'seen' AS seen FROM ch.runs WHERE name = 'seen_stable';

-- The third step fails: the flow fails, the first two steps' writes stay
-- (once each), the failing step's write is gone, D never runs.
INSERT INTO ch.runs SELECT 'fail', flow_id, status, state, error FROM dwarf.run('ch_fail', '{}');
SELECT status, error FROM ch.runs WHERE name = 'fail';
SELECT task FROM ch.log WHERE flow_id = (SELECT flow_id FROM ch.runs WHERE name = 'fail') ORDER BY 1;
SELECT h.task, h.status FROM ch.runs r, LATERAL dwarf.history(r.flow_id) h
 WHERE r.name = 'fail' ORDER BY h.step_id;

-- A sleep ends the chain: what follows it commits later, after its wake time.
INSERT INTO ch.runs SELECT 'nap', flow_id, status, state, error FROM dwarf.run('ch_nap', '{}');
SELECT status, ch.commits(flow_id) >= 2 AS commits_after_the_sleep,
	   (SELECT c.started_at >= b.finished_at + interval '300 ms'
		  FROM (SELECT * FROM dwarf.history(flow_id) WHERE task = 'B') b, (SELECT * FROM dwarf.history(flow_id) WHERE task = 'C') c) AS woke_on_time
  FROM ch.runs WHERE name = 'nap';

-- Quick branches and their fan-in: one or two commits, one row per step.
INSERT INTO ch.runs SELECT 'fan', flow_id, status, state, error FROM dwarf.run('ch_fan', '{}');
SELECT status, ch.commits(flow_id) <= 2 AS one_or_two_commits,
	   (SELECT count(*) FROM dwarf.step s WHERE s.flow_id = r.flow_id) AS steps
  FROM ch.runs r WHERE name = 'fan';

DROP SCHEMA ch CASCADE;
