--
-- archived_owner: every read and operation works the same for a flow's owner
-- (not a superuser) whether the flow is live, its row has moved to the
-- archive while its steps are still in a live segment of the step log, or
-- both have moved.  Row-level security decides what the owner sees, so each
-- read is compared with what the owner saw while the flow was live.
--
\set VERBOSITY terse
CREATE ROLE regress_ao_alice NOLOGIN;
CREATE ROLE regress_ao_bob NOLOGIN;
GRANT USAGE ON SCHEMA dwarf TO regress_ao_alice, regress_ao_bob;
CREATE SCHEMA ao;
GRANT USAGE ON SCHEMA ao TO regress_ao_alice, regress_ao_bob;
CREATE FUNCTION ao.add(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1) $$;
CREATE FUNCTION ao.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'ao boom' USING ERRCODE = '22012'; END $$;
CREATE FUNCTION ao.tick(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
-- Runs a statement; returns 'ok' or its error, with flow and step ids masked.
CREATE FUNCTION ao.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '(flow|step) -?\d+', '\1 N', 'g');
END $$;
GRANT EXECUTE ON FUNCTION ao.try(text) TO PUBLIC;

-- The owner's flows, and what the owner reads of one.
CREATE TABLE ao.flows (name text PRIMARY KEY, id bigint);
CREATE TABLE ao.reads (name text, place text, outcome jsonb, snapshot jsonb, history jsonb,
					   listed jsonb, mermaid text, state jsonb);
GRANT ALL ON ao.flows, ao.reads TO regress_ao_alice, regress_ao_bob;
CREATE FUNCTION ao.read(f_name text, f_place text) RETURNS boolean LANGUAGE sql AS $$
	INSERT INTO ao.reads
	SELECT f.name, f_place,
		   (SELECT to_jsonb(o) FROM dwarf.await(f.id, '0 s') o),
		   (SELECT to_jsonb(s) - 'steps' || jsonb_build_object('steps', s.steps) FROM dwarf.snapshot(f.id) s),
		   (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.step_id) FROM dwarf.history(f.id) h),
		   (SELECT to_jsonb(l) FROM dwarf.list(graph => 'ao_fail') l WHERE l.flow_id = f.id),
		   dwarf.history_mermaid(f.id),
		   dwarf.state_at(f.id)
	  FROM ao.flows f WHERE f.name = f_name
	RETURNING true $$;
GRANT EXECUTE ON FUNCTION ao.read(text, text) TO regress_ao_alice;

-- Where a flow's row and its steps are (read as the superuser).
CREATE FUNCTION ao.place(f_id bigint) RETURNS text LANGUAGE sql AS $$
	SELECT CASE WHEN EXISTS (SELECT 1 FROM dwarf.flow WHERE id = f_id) THEN 'row live'
				WHEN EXISTS (SELECT 1 FROM dwarf.flow_archive WHERE id = f_id) THEN 'row archived'
				ELSE 'row gone' END
		   || ', steps ' || CASE WHEN EXISTS (SELECT 1 FROM dwarf.step WHERE flow_id = f_id) THEN 'live'
								 WHEN EXISTS (SELECT 1 FROM dwarf.step_archive WHERE flow_id = f_id) THEN 'archived'
								 ELSE 'gone' END $$;

-- Creates flows of ao_tick until the ids have passed the segment of the
-- given flow, and waits for them, so that a later pass archives the segment.
CREATE FUNCTION ao.pass(f_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
	hi bigint := (SELECT s.hi FROM dwarf.segment s WHERE f_id >= s.lo AND f_id < s.hi);
	done boolean := true;
BEGIN
	WHILE dwarf_internal.next_flow_id() < hi LOOP
		done := done AND (SELECT r.status = 'completed' FROM dwarf.run('ao_tick', '{}', timeout => '60 s') r);
	END LOOP;
	RETURN done;
END $$;

SET dwarf.archive_after = '1 hour';
SET dwarf.segment_interval = '1 s';
-- A pass first, so that the flows below go to a live segment.
SELECT dwarf.maintain() ? 'segments_made' AS says_segments;
SELECT dwarf.define('ao_tick', '{"tasks": {"T": "ao.tick"}, "transitions": []}') > 0 AS defined;

SET ROLE regress_ao_alice;
SELECT dwarf.define('ao_chain', '{"tasks": {"A": "ao.add", "B": "ao.add", "C": "ao.add"},
  "transitions": [{"chain": ["A", "B", "C", "END"]}]}');
SELECT dwarf.define('ao_fail', '{"tasks": {"A": "ao.add", "B": "ao.boom"},
  "transitions": [{"from": "A", "to": "B"}]}');
INSERT INTO ao.flows SELECT 'failed', flow_id FROM dwarf.run('ao_fail', '{"n": 1}');
INSERT INTO ao.flows SELECT 'keyed', flow_id FROM dwarf.run('ao_chain', '{"n": 10}',
	idempotency_key => 'ao-once', thread => 'ao-thread');
-- one flow for each place to delete
INSERT INTO ao.flows
	SELECT 'delete_' || p, flow_id
	  FROM unnest(ARRAY['live', 'moved', 'archived']) p, LATERAL dwarf.run('ao_chain', jsonb_build_object('place', p)) r;
SELECT name, status FROM ao.flows, dwarf.await(id, '0 s') ORDER BY name;
RESET ROLE;
-- bob's flow, which bob purges while its row is archived and its steps are not
SET ROLE regress_ao_bob;
SELECT dwarf.define('ao_chain', '{"tasks": {"A": "ao.add"}, "transitions": []}');
INSERT INTO ao.flows SELECT 'bob_purge', flow_id FROM dwarf.run('ao_chain', '{}');
RESET ROLE;
SELECT id AS keyed FROM ao.flows WHERE name = 'keyed' \gset

----------------------------------------------------------------------
-- live
----------------------------------------------------------------------
\set place live
\i sql/archived_owner.psql
-- while live: the failed flow's error names the task and SQLSTATE
SELECT listed ->> 'error_task' AS error_task, listed ->> 'error_sqlstate' AS error_sqlstate,
	   snapshot ->> 'error_task' AS snapshot_error_task, jsonb_array_length(history) AS steps
  FROM ao.reads WHERE name = 'failed' AND place = 'live';

----------------------------------------------------------------------
-- the flows' rows move to the archive; their steps stay in the live segment
----------------------------------------------------------------------
SELECT (dwarf_internal.maintain_at(now() + interval '2 hours') ->> 'moved_flows')::int >= 5 AS moved;
SELECT name, ao.place(id) FROM ao.flows ORDER BY name;
\set place moved
\i sql/archived_owner.psql
-- bob purges his flow; alice's are not his to purge
SET ROLE regress_ao_bob;
SELECT dwarf.purge(older_than => '0 s') AS bob_purged;
RESET ROLE;
SELECT name, ao.place(id) FROM ao.flows WHERE name IN ('bob_purge', 'keyed') ORDER BY name;

----------------------------------------------------------------------
-- the segment goes to the archive too
----------------------------------------------------------------------
SELECT ao.pass(:keyed) AS passed;
SELECT jsonb_array_length(dwarf_internal.maintain_at(now() + interval '2 hours') -> 'segments_archived') >= 1 AS segment_archived;
SELECT name, ao.place(id) FROM ao.flows ORDER BY name;
\set place archived
\i sql/archived_owner.psql
-- alice purges hers, archived
SET ROLE regress_ao_alice;
SELECT dwarf.purge(older_than => '0 s') >= 3 AS alice_purged;
RESET ROLE;
SELECT name, ao.place(id) FROM ao.flows ORDER BY name;
