-- pgTAP: dwarf.run and dwarf.define seen from a client's transaction.
-- Runs in one transaction that is rolled back at the end; dwarf.run
-- commits its own flows, so the checks look at those through the API.
BEGIN;
SELECT plan(11);

SELECT has_schema('dwarf');
SELECT has_table('dwarf', 'flow', 'dwarf.flow exists');
SELECT has_view('dwarf', 'step', 'dwarf.step exists, a row per step');
SELECT has_table('dwarf', 'step_log', 'dwarf.step_log exists, the steps packed');
SELECT has_function('dwarf', 'run',
	ARRAY['text', 'jsonb', 'interval', 'integer', 'text', 'text', 'integer', 'interval',
		  'boolean', 'jsonb', 'text'], 'dwarf.run has its documented signature');

CREATE SCHEMA pgtap_dwarf;
CREATE FUNCTION pgtap_dwarf.inc(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1) $$;

SELECT is(dwarf.define('pgtap_inc', '{"tasks": {"A": "pgtap_dwarf.inc", "B": "pgtap_dwarf.inc"},
                                      "transitions": [{"chain": ["A", "B", "END"]}]}'),
		  1, 'define returns the first version');

-- The engine commits dwarf.run's flow outside this transaction, where a
-- graph defined in it is not visible yet: run refuses, and says why.
SELECT throws_ok($$SELECT * FROM dwarf.run('pgtap_inc', '{"n": 1}')$$,
				 '55000', 'graph "pgtap_inc" was defined in this transaction',
				 'run of a graph defined in the same transaction is refused');

-- dwarf.create is transactional: it may use the new graph, and await says
-- that the flow cannot start before the transaction commits.
SELECT lives_ok($$SELECT dwarf.create('pgtap_inc', '{"n": 1}')$$,
				'create may use a graph defined in the same transaction');
SELECT throws_like($$SELECT * FROM dwarf.await((SELECT max(id) FROM dwarf.flow), '1 s')$$,
				   '%was created in this transaction%',
				   'await of a flow created in the same transaction explains itself');

SELECT throws_ok($$SELECT dwarf.define('pgtap_bad', '{"tasks": {}}')$$,
				 '22023', 'invalid graph definition: "tasks" is empty',
				 'an empty graph is rejected');
SELECT throws_ok($$SELECT * FROM dwarf.run('pgtap_no_such_graph', '{}')$$,
				 '42704', 'graph "pgtap_no_such_graph" does not exist',
				 'run of an unknown graph names it');

SELECT * FROM finish();
ROLLBACK;
