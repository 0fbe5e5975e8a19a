--
-- unicode_and_append: every reducer given an array, a scalar, an object and
-- null, in a chain and at a fan-in (with append taking an array's elements);
-- for_each into append; the read functions (fold_changes, state_at,
-- snapshot) agreeing with what the worker computed; and graph names, task
-- names, state keys and values in several scripts, through define, create,
-- run, interrupt, resume, history, history_mermaid and list.
--
\set VERBOSITY terse
-- the names and values below need a UTF8 database
SHOW server_encoding;
CREATE SCHEMA ua;

--
-- 1. Every reducer, every kind of value, in a chain and at a fan-in.
--
-- Tasks T1, T2, T3 (a chain) or branches B1, B2, B3 (a static fan-out
-- meeting at J) write input fields a, b, c to field f, each only when the
-- input has it.  The field starts absent, so the chain and the fan-in must
-- end the same: the fan-in folds its branches' changes in branch order.
CREATE FUNCTION ua.none(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE FUNCTION ua.put_a(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT CASE WHEN s ? 'a' THEN jsonb_build_object('f', s->'a') ELSE '{}' END $$;
CREATE FUNCTION ua.put_b(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT CASE WHEN s ? 'b' THEN jsonb_build_object('f', s->'b') ELSE '{}' END $$;
CREATE FUNCTION ua.put_c(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT CASE WHEN s ? 'c' THEN jsonb_build_object('f', s->'c') ELSE '{}' END $$;
CREATE TABLE ua.reducers (r text, rn int);
INSERT INTO ua.reducers SELECT * FROM unnest(ARRAY['replace', 'append', 'add', 'min', 'max',
	'union', 'merge', 'and', 'or', 'concat']) WITH ORDINALITY;
SELECT r AS reducer,
	   dwarf.define('ua_chain_' || r, jsonb_build_object(
		 'tasks', '{"T1": "ua.put_a", "T2": "ua.put_b", "T3": "ua.put_c"}'::jsonb,
		 'transitions', '[{"chain": ["T1", "T2", "T3", "END"]}]'::jsonb,
		 'reducers', jsonb_build_object('f', r))) AS chain,
	   dwarf.define('ua_fan_' || r, jsonb_build_object(
		 'tasks', '{"A": "ua.none", "B1": "ua.put_a", "B2": "ua.put_b", "B3": "ua.put_c", "J": "ua.none"}'::jsonb,
		 'transitions', '[{"from": "A", "to": ["B1", "B2", "B3"]},
						  {"from": "B1", "to": "J"}, {"from": "B2", "to": "J"}, {"from": "B3", "to": "J"}]'::jsonb,
		 'fan_in', '["J"]'::jsonb,
		 'reducers', jsonb_build_object('f', r))) AS fan_in
  FROM ua.reducers ORDER BY rn;

-- The values: "wrapped" appends arrays whole; "mixed" is an array, then a
-- scalar, then an object (only for the reducers where at most one branch
-- can fail, so that the fan-in's error does not depend on which failing
-- branch runs first); "null" is null, a value the reducer takes, null.
-- A branch merges its changes into its own state first (its next task sees
-- them), so a value that a reducer cannot take as a field's first value
-- fails that branch, as it would fail a chain's first step: concat of
-- "mixed" completes in a chain and fails at the fan-in.
CREATE TABLE ua.kinds (kind text, kn int, input jsonb);
INSERT INTO ua.kinds VALUES
	('array',   1, '{"a": [1, 2], "b": [2, [3]], "c": []}'),
	('wrapped', 2, '{"a": [[1, 2]], "b": [[3]], "c": [4]}'),
	('number',  3, '{"a": 1, "b": 2.5, "c": -1}'),
	('string',  4, '{"a": "b", "b": "é", "c": "a"}'),
	('boolean', 5, '{"a": true, "b": false, "c": true}'),
	('object',  6, '{"a": {"k": 1}, "b": {"k": 2, "m": [1]}, "c": {}}'),
	('mixed',   7, '{"a": [1, 2], "b": "x", "c": {"k": 1}}'),
	('null',    8, NULL);
CREATE TABLE ua.cases AS
SELECT r.r AS reducer, r.rn, k.kind, k.kn,
	   coalesce(k.input, jsonb_build_object('a', NULL::jsonb, 'c', NULL::jsonb, 'b',
		 CASE r.r WHEN 'add' THEN '5' WHEN 'min' THEN '5' WHEN 'max' THEN '5'
				  WHEN 'merge' THEN '{"k": 1}' WHEN 'and' THEN 'true' WHEN 'or' THEN 'true'
				  ELSE '"v"' END::jsonb)) AS input
  FROM ua.reducers r CROSS JOIN ua.kinds k
 WHERE k.kind <> 'mixed' OR r.r IN ('replace', 'append', 'union', 'concat');
SELECT input FROM ua.cases WHERE kind = 'null' AND reducer IN ('append', 'merge');

-- every case is its own flow, so that one failure hides no other
CREATE TABLE ua.started AS
SELECT c.*, dwarf.create('ua_chain_' || reducer, input) AS chain_id,
			dwarf.create('ua_fan_' || reducer, input) AS fan_id
  FROM ua.cases c;
CREATE TABLE ua.matrix AS
SELECT s.reducer, s.rn, s.kind, s.kn, ch AS chain, fa AS fan
  FROM ua.started s, LATERAL dwarf.await(s.chain_id) ch, LATERAL dwarf.await(s.fan_id) fa;
-- f after the flow (absent: no field f), or the error
CREATE FUNCTION ua.f(o dwarf.outcome) RETURNS text LANGUAGE sql AS $$
	SELECT CASE WHEN o.status = 'completed' THEN coalesce((o.state->'f')::text, '(absent)')
				ELSE o.status || ': ' || o.error END
$$;
-- for a completed flow: do dwarf.state_at and dwarf.snapshot give its final state?
CREATE FUNCTION ua.reads_agree(o dwarf.outcome) RETURNS boolean LANGUAGE sql AS $$
	SELECT CASE WHEN o.status = 'completed' THEN
		   dwarf.state_at(o.flow_id) = o.state
		   AND (SELECT s.state FROM dwarf.snapshot(o.flow_id) s) = o.state END
$$;
SELECT reducer, kind, ua.f(chain) AS chain, ua.f(fan) AS fan_in,
	   ua.f(chain) = ua.f(fan) AS same,
	   ua.reads_agree(chain) AND ua.reads_agree(fan) AS reads_agree
  FROM ua.matrix ORDER BY rn, kn;
-- each failed chain failed at its first task, with nothing of f in its
-- state; no failed fan-in flow ran its fan-in task
SELECT count(*) FILTER (WHERE (chain).status = 'failed') AS chains_failed,
	   count(*) FILTER (WHERE (fan).status = 'failed') AS fan_ins_failed,
	   count(*) FILTER (WHERE (chain).status = 'failed' AND (chain).state ? 'f') AS failed_chain_with_f,
	   (SELECT count(*) FROM ua.matrix m2, LATERAL dwarf.history((m2.chain).flow_id) h
		 WHERE (m2.chain).status = 'failed' AND h.status = 'failed' AND h.task <> 'T1') AS failed_later,
	   (SELECT count(*) FROM ua.matrix m2, LATERAL (SELECT * FROM dwarf.history((m2.fan).flow_id) WHERE task = 'J') h
		 WHERE (m2.fan).status = 'failed') AS fan_in_steps_of_failed
  FROM ua.matrix;

-- each step's changes are the task's own value (the delta), not the reduced field
SELECT h.task, h.changes FROM ua.matrix m, LATERAL dwarf.history((m.chain).flow_id) h
 WHERE m.reducer = 'append' AND m.kind = 'wrapped' ORDER BY h.step_id;

-- Branch order is not completion order: B1 writes after a step of its own
-- (B0), so it finishes last, yet folds first.  dwarf.state_at (and the
-- snapshot of a running flow, which is built from it) must fold the same way.
-- J reports the state it was given; given "hold", what follows J (K) waits.
CREATE FUNCTION ua.hold(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF s ? 'hold' THEN
		PERFORM dwarf.sleep('1 hour');
	END IF;
	RETURN jsonb_build_object('j_saw', s->'f');
END $$;
SELECT r AS reducer,
	   dwarf.define('ua_late_' || r, jsonb_build_object(
		 'tasks', '{"A": "ua.none", "B0": "ua.none", "B1": "ua.put_a", "B2": "ua.put_b",
					"B3": "ua.put_c", "J": "ua.hold", "K": "ua.none"}'::jsonb,
		 'transitions', '[{"from": "A", "to": ["B0", "B2", "B3"]}, {"from": "B0", "to": "B1"},
						  {"from": "B1", "to": "J"}, {"from": "B2", "to": "J"}, {"from": "B3", "to": "J"},
						  {"from": "J", "to": "K"}]'::jsonb,
		 'fan_in', '["J"]'::jsonb,
		 'reducers', jsonb_build_object('f', r))) AS late
  FROM ua.reducers WHERE r IN ('replace', 'append', 'union', 'merge', 'concat') ORDER BY rn;
CREATE TABLE ua.late AS
SELECT v.n, v.r AS reducer, o.*
  FROM (VALUES
	(1, 'append',  '{"f": ["seed"], "a": ["a1", "a2"], "b": "b", "c": [["c"]]}'::jsonb),
	(2, 'replace', '{"a": 1, "b": 2, "c": 3}'),
	(3, 'union',   '{"a": [1], "b": [2, 1], "c": 3}'),
	(4, 'merge',   '{"a": {"k": "a", "a": 1}, "b": {"k": "b"}, "c": {"k": "c", "c": 3}}'),
	(5, 'concat',  '{"a": "1", "b": "2", "c": "3"}')) v(n, r, input),
	LATERAL dwarf.run('ua_late_' || v.r, v.input) o;
SELECT reducer, status, state->'f' AS f, state->'j_saw' AS j_saw,
	   dwarf.state_at(flow_id)->'f' AS state_at_f,
	   dwarf.state_at(flow_id) = state AS state_at_agrees,
	   (SELECT s.state FROM dwarf.snapshot(flow_id) s) = state AS snapshot_agrees,
	   (SELECT max(h.step_id) FILTER (WHERE h.task = 'B1') > max(h.step_id) FILTER (WHERE h.task IN ('B2', 'B3'))
		  FROM dwarf.history(flow_id) h) AS b1_finished_last
  FROM ua.late ORDER BY n;
-- the same flow held at J (a durable sleep): the snapshot of the running
-- flow must show the state the fan-in was given
CREATE TABLE ua.held AS
SELECT dwarf.create('ua_late_append', '{"hold": true, "a": ["a1", "a2"], "b": "b", "c": [["c"]]}') AS flow_id;
DO $$
DECLARE
	i int := 0;
BEGIN
	WHILE NOT EXISTS (SELECT 1 FROM ua.held, LATERAL (SELECT * FROM dwarf.history(flow_id) WHERE task = 'J') h) AND i < 200 LOOP
		PERFORM pg_sleep(0.05);
		i := i + 1;
	END LOOP;
END $$;
SELECT s.status, s.state->'f' AS snapshot_f, j.changes->'j_saw' AS fan_in_saw,
	   s.state->'f' = j.changes->'j_saw' AS agrees,
	   (SELECT max(h.step_id) FILTER (WHERE h.task = 'B1') > max(h.step_id) FILTER (WHERE h.task IN ('B2', 'B3'))
		  FROM dwarf.history(h.flow_id) h) AS b1_finished_last
  FROM ua.held h, LATERAL dwarf.snapshot(h.flow_id) s, LATERAL (SELECT * FROM dwarf.history(h.flow_id) WHERE task = 'J') j;
SELECT dwarf.cancel(flow_id, 'done looking') FROM ua.held;
SELECT o.status, o.cancel_reason FROM ua.held, LATERAL dwarf.await(flow_id) o;

-- dwarf_internal.fold_changes: append, as in a chain
SELECT c AS change,
	   dwarf_internal.fold_changes('{"f": ["a"]}', ARRAY[jsonb_build_object('f', c::jsonb)], '{"f": "append"}') AS state
  FROM unnest(ARRAY['"b"', '["b", "c"]', '[["b"]]', '{"b": 1}', 'null', '[]', '[null]',
					'[["b"], "c", {"d": [1]}]', '[[]]']) c;
-- a field that was not an array yet, and one that was absent
SELECT dwarf_internal.fold_changes('{"f": {"k": 1}}', ARRAY['{"f": [2, 3]}']::jsonb[], '{"f": "append"}');
SELECT dwarf_internal.fold_changes('{}', ARRAY['{"f": null}', '{"f": [[1], 2]}', '{"f": null}', '{"f": [3]}']::jsonb[],
						  '{"f": "append"}');

--
-- 2. for_each into append: the branches' values in element order, whatever
-- order the branches finish in (branch 0 waits before its second step).
--
CREATE FUNCTION ua.wait_first(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF (s->>'itemIndex')::int = 0 THEN
		PERFORM dwarf.sleep('200 ms');
	END IF;
	RETURN NULL;
END $$;
CREATE FUNCTION ua.seen(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('seen', jsonb_build_array(s->'itemIndex'),
							  'one', s->'itemIndex',
							  'whole', jsonb_build_array(jsonb_build_array(s->'itemIndex', s->'item')))
$$;
SELECT dwarf.define('ua_each', '{"tasks": {"A": "ua.none", "W": "ua.wait_first", "S": "ua.seen", "J": "ua.none"},
  "transitions": [{"from": "A", "to": "W", "for_each": "items"}, {"from": "W", "to": "S"},
				  {"from": "S", "to": "J"}],
  "fan_in": ["J"], "reducers": {"seen": "append", "one": "append", "whole": "append"}}');
CREATE TABLE ua.each AS SELECT * FROM dwarf.run('ua_each', '{"items": ["x", "y", "z"]}');
SELECT status, state->'seen' AS seen, state->'one' AS one, state->'whole' AS whole,
	   state ?| ARRAY['item', 'itemIndex', 'itemCount'] AS has_keys
  FROM ua.each;
-- the order the branches finished in, and the read functions
SELECT (SELECT h.changes->'one' FROM dwarf.history(flow_id) h WHERE h.task = 'S'
		 ORDER BY h.step_id DESC LIMIT 1) AS finished_last,
	   dwarf.state_at(flow_id)->'seen' AS state_at_seen,
	   dwarf.state_at(flow_id) = state AS state_at_agrees,
	   (SELECT s.state FROM dwarf.snapshot(flow_id) s) = state AS snapshot_agrees
  FROM ua.each;
-- an empty for_each appends nothing
SELECT status, state->'seen' AS seen, state->'whole' AS whole FROM dwarf.run('ua_each', '{"items": []}');

--
-- 3. Scripts: accents, CJK, right-to-left, emoji and a ZWJ sequence in graph
-- names, task names, state keys and values.
--
-- what the literals below are (👩‍💻 is U+1F469 U+200D U+1F4BB)
SELECT s, octet_length(s) AS bytes, length(s) AS chars,
	   (SELECT string_agg(upper(to_hex(ascii(c))), ' ') FROM regexp_split_to_table(s, '') c) AS code_points
  FROM unnest(ARRAY['Café', 'Grüße', '日本語', 'שלום', 'مرحبا', '🚀', '👩‍💻']) s;

-- A graph name is 1 to 63 bytes of printable text: control characters and
-- spaces at either end are refused (graph_names tests look-alikes).
-- (Control characters and non-ASCII spaces are shown here as <U+XXXX>.)
CREATE FUNCTION ua.visible(t text) RETURNS text LANGUAGE sql AS $$
	SELECT coalesce(string_agg(CASE WHEN ascii(c) < 32 OR ascii(c) BETWEEN 127 AND 159
									  OR ascii(c) IN (160, 8232, 8233, 12288)
									THEN format('<U+%s>', upper(lpad(to_hex(ascii(c)), 4, '0')))
									ELSE c END, '' ORDER BY i), '')
	  FROM regexp_split_to_table(t, '') WITH ORDINALITY x(c, i) WHERE c <> ''
$$;
CREATE FUNCTION ua.echo(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT jsonb_build_object('echo', s->'msg') $$;
CREATE FUNCTION ua.try_define(name text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	RETURN 'version ' || dwarf.define(name, jsonb_build_object('tasks', jsonb_build_object(name, 'ua.echo')));
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || ua.visible(SQLERRM);
END $$;
CREATE TABLE ua.names (n int, name text, msg text);
INSERT INTO ua.names VALUES
	(1, 'café_Grüße', 'ça marche, schön'),
	(2, '日本語のフロー', 'こんにちは'),
	(3, 'שלום', 'שלום עולם'),
	(4, 'مرحبا', 'مرحبا بالعالم'),
	(5, '🚀', '🚀🚀'),
	(6, '👩‍💻', '👩‍💻 codes'),
	(7, '🚀 launch', 'a space inside is fine'),
	(8, '日本' || U&'\3000' || '語', 'so is U+3000 inside'),
	(9, repeat('日', 21), '63 bytes'),
	(10, repeat('🚀', 15) || '日', '63 bytes'),
	(11, repeat('👩‍💻', 5) || 'abcd🚀', '63 bytes'),
	(21, repeat('日', 21) || 'a', NULL),
	(22, 'a' || repeat('🚀', 15) || '日', NULL),
	(23, repeat('👩‍💻', 6), NULL),
	(24, '', NULL),
	(25, E'tab\there', NULL),
	(26, E'new\nline', NULL),
	(27, 'next' || U&'\0085' || 'line', NULL),
	(28, 'line' || U&'\2028' || 'separator', NULL),
	(29, 'ends with' || U&'\0085', NULL),
	(30, 'del' || chr(127), NULL),
	(31, ' leading', NULL),
	(32, 'trailing ', NULL),
	(33, U&'\3000' || '日本語', NULL),
	(34, '日本語' || U&'\3000', NULL),
	(35, ' ', NULL);
SELECT n, ua.visible(name) AS name, octet_length(name) AS bytes, ua.try_define(name) AS define
  FROM ua.names ORDER BY n;
-- the error says what a graph name may be
SELECT dwarf.define('trailing ', '{"tasks": {"T": "ua.echo"}}');
DO $$
DECLARE
	h text;
BEGIN
	PERFORM dwarf.define(repeat('日', 21) || 'a', '{"tasks": {"T": "ua.echo"}}');
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS h = PG_EXCEPTION_HINT;
	RAISE NOTICE 'hint: %', h;
END $$;
-- refused names were not stored; accepted ones are stored as given
SELECT count(*) AS stored_refused FROM dwarf.graph g JOIN ua.names n ON n.name = g.name WHERE n.msg IS NULL;
SELECT n.n, g.name = n.name AS same_name, g.version FROM ua.names n JOIN dwarf.graph g ON g.name = n.name
 WHERE n.msg IS NOT NULL ORDER BY n.n;

-- a flow of each accepted name (dwarf.create, then await); dwarf.list finds
-- it by graph name, and history names its task
CREATE TABLE ua.name_flows AS
SELECT n, dwarf.create(name, jsonb_build_object('msg', msg)) AS flow_id FROM ua.names WHERE msg IS NOT NULL;
CREATE TABLE ua.name_done AS
SELECT f.n, o.* FROM ua.name_flows f, LATERAL dwarf.await(f.flow_id) o;
SELECT f.n, f.status, f.state->'echo' AS echo,
	   (SELECT array_agg(l.graph) FROM dwarf.list(graph => n.name) l) = ARRAY[n.name] AS listed,
	   (SELECT l.flow_id FROM dwarf.list(graph => n.name) l) = f.flow_id AS same_flow,
	   (SELECT array_agg(h.task) FROM dwarf.history(f.flow_id) h) = ARRAY[n.name] AS history_task,
	   (SELECT s.graph FROM dwarf.snapshot(f.flow_id) s) = n.name AS snapshot_graph
  FROM ua.name_done f JOIN ua.names n USING (n) ORDER BY f.n;
SELECT l.graph, l.version, l.status FROM dwarf.list(graph => '日本語のフロー') l;
SELECT l.graph, l.version, l.status FROM dwarf.list(graph => '👩‍💻') l;
-- a name is exact: no prefix or part of a sequence finds another graph's flows
SELECT count(*) AS found FROM dwarf.list(graph => '👩');
SELECT count(*) AS found FROM dwarf.list(graph => '日本語');

-- A whole flow in many scripts: a fan-out in two right-to-left branches, a
-- fan-in, an interrupt and a resume; reduced fields with non-ASCII names.
CREATE FUNCTION ua.café(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT '{"étapes": "Café", "合計": 1, "clé": "élan"}'::jsonb $$;
CREATE FUNCTION ua.ja(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT '{"étapes": "日本語", "合計": 1, "キー": "値"}'::jsonb $$;
CREATE FUNCTION ua.he(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT '{"étapes": "שלום", "合計": 1, "מפתח": "ערך"}'::jsonb $$;
CREATE FUNCTION ua.ar(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT '{"étapes": "مرحبا", "合計": 1, "مفتاح": "قيمة"}'::jsonb $$;
CREATE FUNCTION ua.rocket(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('étapes', '🚀', '合計', 1, '🔑', '🚀✨', 'vu', s->'étapes') $$;
CREATE FUNCTION ua.coder(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	d jsonb := dwarf.interrupt(jsonb_build_object('question', 'Approuvé ? 承認しますか？ מאושר? موافق؟',
												  'par', '👩‍💻', 'vu', s->'étapes'));
BEGIN
	IF d IS NULL THEN
		RETURN NULL;
	END IF;
	RETURN jsonb_build_object('étapes', '👩‍💻', '合計', 1, 'réponse', d->'réponse');
END $$;
SELECT dwarf.validate('{"tasks": {"Café": "ua.café", "日本語": "ua.ja"},
  "transitions": [{"from": "Café", "to": "日本語"}]}')->'entry' AS entry;
SELECT octet_length('flujo café ü 日本語 שלום مرحبا 🚀 👩‍💻') AS bytes;
SELECT dwarf.define('flujo café ü 日本語 שלום مرحبا 🚀 👩‍💻', '{
  "tasks": {"Café": "ua.café", "日本語": "ua.ja", "שלום": "ua.he", "مرحبا": "ua.ar",
			"🚀": "ua.rocket", "👩‍💻": "ua.coder"},
  "transitions": [
	{"from": "Café", "to": "日本語"},
	{"from": "日本語", "to": ["שלום", "مرحبا"]},
	{"from": "שלום", "to": "🚀"}, {"from": "مرحبا", "to": "🚀"},
	{"chain": ["🚀", "👩‍💻", "END"]}],
  "fan_in": ["🚀"],
  "reducers": {"étapes": "append", "合計": "add"}}');
CREATE TABLE ua.world AS
SELECT * FROM dwarf.run('flujo café ü 日本語 שלום مرحبا 🚀 👩‍💻', '{"client": "Zoë Ünal", "客户": "山田太郎"}');
SELECT status, interrupt_payload, state->'étapes' AS "étapes", state->'合計' AS "合計" FROM ua.world;
SELECT l.graph, l.status FROM dwarf.list(graph => 'flujo café ü 日本語 שלום مرحبا 🚀 👩‍💻') l;
SELECT dwarf.resume(flow_id, '{"réponse": "はい ✅ כן نعم 👍🏽"}') FROM ua.world;
CREATE TABLE ua.world_done AS SELECT o.* FROM ua.world w, LATERAL dwarf.await(w.flow_id) o;
SELECT status, error FROM ua.world_done;
SELECT key, value FROM ua.world_done, jsonb_each(state) ORDER BY key COLLATE "C";
SELECT dwarf.state_at(flow_id) = state AS state_at_agrees,
	   (SELECT s.state FROM dwarf.snapshot(flow_id) s) = state AS snapshot_agrees,
	   (SELECT s.graph FROM dwarf.snapshot(flow_id) s) AS graph
  FROM ua.world_done;
SELECT l.graph, l.status FROM dwarf.list(graph => 'flujo café ü 日本語 שלום مرحبا 🚀 👩‍💻') l;
-- history names the tasks; the interrupt's payload and the resume's data are kept
SELECT h.task, h.status, h.attempt, h.changes->'étapes' AS "étapes"
  FROM ua.world w, LATERAL dwarf.history(w.flow_id) h ORDER BY h.step_id;
SELECT s.task, s.status, s.signal FROM ua.world w JOIN dwarf.step s ON s.flow_id = w.flow_id
 WHERE s.signal IS NOT NULL ORDER BY s.step_id;
SELECT st.task, st.status FROM ua.world w, LATERAL (SELECT * FROM dwarf.history(w.flow_id) WHERE task = '👩‍💻') st ORDER BY st.step_id;
-- the Mermaid chart: one quoted label per task, every edge between known nodes
\pset format unaligned
\pset tuples_only on
SELECT dwarf.history_mermaid(flow_id) FROM ua.world;
\pset format aligned
\pset tuples_only off
SELECT line AS not_mermaid
  FROM ua.world w, regexp_split_to_table(dwarf.history_mermaid(w.flow_id), E'\n') line
 WHERE line <> '' AND line !~ ('^(flowchart TD'
	|| '|    n[0-9]+\["[^"]+<br/>(not run|[a-z]+( x[0-9]+)?)"\]:::[a-z]+'
	|| '|    END_\(\("END"\)\)'
	|| '|    n[0-9]+ (-->|-->\|[a-z_]+\||-\.->\|[a-z_]+\|) (n[0-9]+|END_)'
	|| '|    classDef [a-z]+ [-a-z0-9:#,]+)$');
SELECT count(*) AS labels_naming_a_task
  FROM ua.world w, regexp_matches(dwarf.history_mermaid(w.flow_id), '\["([^"]+)<br/>', 'g') m
 WHERE m[1] IN ('Café', '日本語', 'שלום', 'مرحبا', '🚀', '👩‍💻');

-- for_each with a non-ASCII field and "as": élément, élémentIndex, élémentCount
CREATE FUNCTION ua.vu(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('vus', jsonb_build_array(s->'élémentIndex'),
							  'paires', jsonb_build_array(jsonb_build_array(s->'élément', s->'élémentIndex', s->'élémentCount')))
$$;
SELECT dwarf.define('éléments', '{"tasks": {"Départ": "ua.none", "Vu": "ua.vu", "Fin": "ua.none"},
  "transitions": [{"from": "Départ", "to": "Vu", "for_each": "éléments", "as": "élément"},
				  {"from": "Vu", "to": "Fin"}],
  "fan_in": ["Fin"], "reducers": {"vus": "append", "paires": "append"}}');
SELECT status, state->'vus' AS vus, state->'paires' AS paires,
	   state ?| ARRAY['élément', 'élémentIndex', 'élémentCount'] AS has_keys
  FROM dwarf.run('éléments', '{"éléments": ["日本", "שלום", "🚀"]}');

DROP SCHEMA ua CASCADE;
