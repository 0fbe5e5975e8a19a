--
-- subgraph_child_delete: a child flow that a parent's dwarf.subgraph call
-- started cannot be deleted, or purged, while the parent is open: the
-- parent's step reads the child's outcome whenever it runs again, and
-- without the child it would silently start a new one.  dwarf.delete says
-- so, with what to do instead (cancel the child, or delete the parent);
-- once the parent has closed, its children can go.
--
CREATE SCHEMA scd;
CREATE FUNCTION scd.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	msg text;
	detail text;
	hint text;
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
		hint = PG_EXCEPTION_HINT;
	RETURN regexp_replace(SQLSTATE || ': ' || msg || E'\nDETAIL: ' || detail || E'\nHINT: ' || hint,
						  '(flow) -?\d+', '\1 N', 'gi');
END $$;
CREATE FUNCTION scd.wait_until(cond text, seconds int DEFAULT 60) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE ok boolean;
BEGIN
	FOR i IN 1 .. seconds * 20 LOOP
		EXECUTE 'SELECT ' || cond INTO ok;
		IF ok THEN RETURN true; END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;
	RETURN false;
END $$;

-- The parent's one task starts a quick child, then, once that completed, a
-- child that naps for an hour, and returns both children's states.
CREATE FUNCTION scd.quick(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"quick": true}'::jsonb $$;
CREATE FUNCTION scd.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep('1 hour'); RETURN '{}'; END $$;
CREATE FUNCTION scd.after(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"napped": true}'::jsonb $$;
CREATE FUNCTION scd.call_children(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	q jsonb;
	n jsonb;
BEGIN
	q := dwarf.subgraph('scd_quick', '{}');
	IF q IS NULL THEN RETURN '{}'; END IF;
	n := dwarf.subgraph('scd_nap', '{}');
	IF n IS NULL THEN RETURN '{}'; END IF;
	RETURN jsonb_build_object('children', jsonb_build_array(q, n));
END $$;
SELECT dwarf.define('scd_quick', '{"tasks": {"Q": "scd.quick"}}');
SELECT dwarf.define('scd_nap', '{"tasks": {"Nap": "scd.nap", "After": "scd.after"},
  "transitions": [{"from": "Nap", "to": "After"}]}');
SELECT dwarf.define('scd_parent', '{"tasks": {"Call": "scd.call_children"}}');

SELECT dwarf.create('scd_parent', '{}') AS parent_id \gset
-- the parent waits for the napping child, the quick one has completed
SELECT scd.wait_until(format('EXISTS (SELECT 1 FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	WHERE f.parent_id = %s AND g.name = %L
	  AND EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id))', :parent_id, 'scd_nap'))
	AS nap_child_sleeping;
SELECT f.id AS quick_id FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE f.parent_id = :parent_id AND g.name = 'scd_quick' \gset
SELECT f.id AS nap_id FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE f.parent_id = :parent_id AND g.name = 'scd_nap' \gset
SELECT (SELECT status FROM dwarf.flow WHERE id = :parent_id) AS parent,
	   (SELECT status FROM dwarf.flow WHERE id = :quick_id) AS quick_child,
	   (SELECT status FROM dwarf.flow WHERE id = :nap_id) AS nap_child;

-- Deleting the child the parent waits for is refused, and says why and what
-- to do instead; so is deleting the completed child, which the parent's
-- step reads again when it runs again.
SELECT scd.try(format('SELECT dwarf.delete(%s)', :nap_id));
SELECT scd.try(format('SELECT dwarf.delete(%s)', :quick_id));
-- purge leaves both children (one is closed: it is older than 0 s)
SELECT dwarf.purge('0 s') >= 0 AS purged;
SELECT count(*) AS children FROM dwarf.flow WHERE parent_id = :parent_id;
-- the parent still waits for the same child: no new child was started
SELECT (SELECT status FROM dwarf.flow WHERE id = :parent_id) AS parent,
	   (SELECT string_agg(g.name, ', ' ORDER BY g.name) FROM dwarf.flow f
		  JOIN dwarf.graph g ON g.id = f.graph_id WHERE f.parent_id = :parent_id) AS children;

-- As the hint says: cancel the child; the parent's step then fails with it.
SELECT dwarf.cancel(:nap_id, 'not needed');
SELECT status, regexp_replace(error, 'flow \d+', 'flow N') AS error
  FROM dwarf.await(:parent_id, '60 s');
-- The parent has closed: its children may go now, one by one.
SELECT dwarf.delete(:nap_id);
SELECT dwarf.delete(:quick_id);
SELECT count(*) AS children FROM dwarf.flow WHERE parent_id = :parent_id;
SELECT count(*) AS parents FROM dwarf.flow WHERE id = :parent_id;

-- Deleting a waiting parent deletes its children with it.
SELECT dwarf.create('scd_parent', '{}') AS parent2_id \gset
SELECT scd.wait_until(format('EXISTS (SELECT 1 FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	WHERE f.parent_id = %s AND g.name = %L)', :parent2_id, 'scd_nap')) AS nap_child_started;
SELECT dwarf.delete(:parent2_id);
SELECT count(*) AS family_left FROM dwarf.flow WHERE id = :parent2_id OR parent_id = :parent2_id;

-- The workers are fine, and nothing of ours is left.
SELECT status, state FROM dwarf.run('scd_quick', '{}', timeout => '60 s');
SELECT count(*) > 0 AS deleted_some FROM (
	SELECT dwarf.delete(f.id) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE g.name LIKE 'scd\_%' AND f.parent_id IS NULL) d;
SELECT count(*) AS scd_flows_left FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name LIKE 'scd\_%';
DROP SCHEMA scd CASCADE;
