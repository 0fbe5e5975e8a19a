--
-- run_outcome: dwarf.run's flow is created in the batch that runs its first
-- steps (written directly, or by statement when it has an idempotency key),
-- and a flow that closes in that commit has its outcome handed back with
-- its id.  Whichever way it came, what dwarf.run returns is what
-- dwarf.await reads from the table afterwards, and the flow's row is the
-- row dwarf.create writes for the same call.
--
\set VERBOSITY terse
CREATE SCHEMA ro;
CREATE FUNCTION ro.echo(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('echoed', coalesce(s->'pad', 'null'::jsonb)) $$;
CREATE FUNCTION ro.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'ünïcode boom'; END $$;
SELECT dwarf.define('ro_echo', '{"tasks": {"A": "ro.echo", "B": "ro.echo"},
  "transitions": [{"from": "A", "to": "B"}]}');
SELECT dwarf.define('ro_boom', '{"tasks": {"A": "ro.echo", "B": "ro.boom"},
  "transitions": [{"from": "A", "to": "B"}]}');

CREATE TABLE ro.runs (n serial, name text, o dwarf.outcome);
INSERT INTO ro.runs (name, o) SELECT 'small', r FROM dwarf.run('ro_echo', '{"pad": "x"}') r;
-- a final state that fits in the request slot (2 kB), and one that does not
INSERT INTO ro.runs (name, o)
	SELECT 'fits', r FROM dwarf.run('ro_echo', jsonb_build_object('pad', repeat('é', 400))) r;
INSERT INTO ro.runs (name, o)
	SELECT 'too big', r FROM dwarf.run('ro_echo', jsonb_build_object('pad', repeat('x', 3000))) r;
INSERT INTO ro.runs (name, o) SELECT 'failed', r FROM dwarf.run('ro_boom', '{}') r;
INSERT INTO ro.runs (name, o)
	SELECT 'options', r FROM dwarf.run('ro_echo', '{"pad": 1}', priority => 2,
		fairness_key => 'tenant-1', fairness_weight => 3, time_budget => '1 hour 30 s',
		baggage => '{"b": [1, 2]}', thread => 'ro-thread') r;
INSERT INTO ro.runs (name, o)
	SELECT 'keyed', r FROM dwarf.run('ro_echo', '{"pad": "k"}', idempotency_key => 'ro-1') r;
INSERT INTO ro.runs (name, o)
	SELECT 'keyed again', r FROM dwarf.run('ro_echo', '{"pad": "other"}', idempotency_key => 'ro-1') r;

SELECT name, (o).status, (o).error, octet_length((o).state::text) AS state_bytes,
	   (o).state->'echoed' = (o).state->'pad' AS echoed,
	   ROW((o).*) IS NOT DISTINCT FROM (SELECT ROW(a.*) FROM dwarf.await((o).flow_id) a) AS as_await
  FROM ro.runs ORDER BY n;
SELECT count(DISTINCT (o).flow_id) = 6 AS keyed_runs_share_a_flow FROM ro.runs;

-- deleted on completion: the outcome is what await says of a flow that is gone
SELECT status, state IS NULL AS no_state, error
  FROM dwarf.run('ro_echo', '{}', delete_on_completion => true);

-- the row of a flow dwarf.run made is the row dwarf.create makes for the same call
SELECT dwarf.create('ro_echo', '{"pad": 1}', priority => 2,
		fairness_key => 'tenant-1', fairness_weight => 3, time_budget => '1 hour 30 s',
		baggage => '{"b": [1, 2]}', thread => 'ro-thread') AS created \gset
SELECT status FROM dwarf.await(:created, '30 s');
SELECT to_jsonb(r) - '{id,created_at,finished_at}'::text[] = to_jsonb(c) - '{id,created_at,finished_at}'::text[]
		AS same_row,
	   r.created_at <= r.finished_at AS created_before_finished,
	   to_jsonb(r) - '{id,created_at,finished_at,input,state,owner,graph_id}'::text[] AS row
  FROM dwarf.flow r, dwarf.flow c, ro.runs
 WHERE ro.runs.name = 'options' AND r.id = (ro.runs.o).flow_id AND c.id = :created;
-- each step of a run's flow has its row, in the flow's order
SELECT r.name, array_agg(s.task ORDER BY s.step_id) AS tasks, array_agg(s.status ORDER BY s.step_id) AS statuses
  FROM ro.runs r JOIN dwarf.step s ON s.flow_id = (r.o).flow_id
 WHERE r.name IN ('small', 'failed') GROUP BY r.name ORDER BY r.name;

-- a create that fails in the worker (here a trigger refuses the row; with an
-- idempotency key the create goes through the INSERT statement, which fires
-- it) fails its caller alone, with the reason; the next call is served
CREATE FUNCTION ro.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.input ? 'refuse' THEN
		RAISE EXCEPTION 'refused by a trigger';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER ro_refuse BEFORE INSERT ON dwarf.flow FOR EACH ROW EXECUTE FUNCTION ro.refuse();
SELECT status FROM dwarf.run('ro_echo', '{"refuse": true}', idempotency_key => 'ro-refused');
SELECT status FROM dwarf.run('ro_echo', '{"pad": 2}', idempotency_key => 'ro-after');
DROP TRIGGER ro_refuse ON dwarf.flow;
SELECT count(*) AS refused_flows FROM dwarf.flow WHERE input ? 'refuse';
