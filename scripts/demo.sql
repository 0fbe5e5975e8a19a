-- dwarf demo: order fulfilment with a fork and a join.
--
--                    +--> Charge --+
--   order --> Reserve               +--> Ship --> END
--                    +--> Pack ----+
--
-- Reserve takes the items out of stock; Charge and Pack then run in parallel
-- (a static fan-out); Ship is the fan-in node and runs once both are done, with
-- their changes merged into the state.  Every task returns {"log": "<what it
-- did>"} and "log" has the append reducer, so a finished flow's log lists the
-- steps in order, the two branches in the order of "to".
--
-- Run by scripts/demo.sh; by hand:  psql -v ON_ERROR_STOP=1 -d demo -f scripts/demo.sql
-- (on a server with shared_preload_libraries = 'dwarf').  Re-runnable: it
-- drops and recreates schema shop.  Fails (non-zero psql status) unless the
-- three flows completed and each step wrote exactly once.

\set ON_ERROR_STOP on
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS dwarf;

\echo
\echo '== 1. The shop: tables, and one task function per step'
DROP SCHEMA IF EXISTS shop CASCADE;
CREATE SCHEMA shop;

CREATE TABLE shop.stock (
	sku      text PRIMARY KEY,
	on_hand  int NOT NULL CHECK (on_hand >= 0)
);

CREATE TABLE shop.orders (
	order_id    int PRIMARY KEY,
	sku         text NOT NULL REFERENCES shop.stock,
	qty         int NOT NULL,
	status      text NOT NULL,
	reserved_at timestamptz NOT NULL DEFAULT now()
);

-- No unique constraint on order_id below, on purpose: if a step ran twice its
-- second row would show in the counts at the end instead of failing the step.
CREATE TABLE shop.payments (
	payment_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id    int NOT NULL REFERENCES shop.orders,
	amount      numeric(10, 2) NOT NULL,
	paid_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE shop.shipments (
	shipment_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id    int NOT NULL REFERENCES shop.orders,
	packed_at   timestamptz NOT NULL DEFAULT now(),
	shipped_at  timestamptz,
	tracking    text
);

INSERT INTO shop.stock VALUES ('widget', 10), ('gadget', 5);

-- Reserve: take the items out of stock (or fail the flow) and record the order.
CREATE FUNCTION shop.reserve(state jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	v_order int  := (state->>'order')::int;
	v_sku   text := state->>'sku';
	v_qty   int  := (state->>'qty')::int;
BEGIN
	UPDATE shop.stock SET on_hand = on_hand - v_qty
	 WHERE sku = v_sku AND on_hand >= v_qty;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'order %: not enough % in stock for %', v_order, v_sku, v_qty;
	END IF;
	INSERT INTO shop.orders (order_id, sku, qty, status)
	VALUES (v_order, v_sku, v_qty, 'reserved');
	RETURN jsonb_build_object('reserved', v_qty, 'log', 'reserved');
END
$$;

-- Charge (branch 1): take the payment.
CREATE FUNCTION shop.charge(state jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	v_id     bigint;
	v_amount numeric;
BEGIN
	INSERT INTO shop.payments (order_id, amount)
	VALUES ((state->>'order')::int, (state->>'qty')::int * (state->>'price')::numeric)
	RETURNING payment_id, amount INTO v_id, v_amount;
	RETURN jsonb_build_object('payment_id', v_id, 'amount', v_amount, 'log', 'charged');
END
$$;

-- Pack (branch 2): put the parcel together.
CREATE FUNCTION shop.pack(state jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	v_id bigint;
BEGIN
	INSERT INTO shop.shipments (order_id) VALUES ((state->>'order')::int)
	RETURNING shipment_id INTO v_id;
	RETURN jsonb_build_object('shipment_id', v_id, 'log', 'packed');
END
$$;

-- Ship (the join): needs what both branches returned.
CREATE FUNCTION shop.ship(state jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	v_order    int := (state->>'order')::int;
	v_tracking text;
BEGIN
	IF state->'payment_id' IS NULL OR state->'shipment_id' IS NULL THEN
		RAISE EXCEPTION 'order %: Ship needs both Charge and Pack, state is %', v_order, state;
	END IF;
	UPDATE shop.shipments
	   SET shipped_at = now(), tracking = format('TRK-%s-%s', v_order, shipment_id)
	 WHERE shipment_id = (state->>'shipment_id')::bigint
	RETURNING tracking INTO v_tracking;
	UPDATE shop.orders SET status = 'shipped' WHERE order_id = v_order;
	RETURN jsonb_build_object('tracking', v_tracking, 'log', 'shipped');
END
$$;

\echo
\echo '== 2. The workflow: dwarf.define returns the new version of graph "checkout"'
SELECT dwarf.define('checkout', $graph$
{
  "entry": "Reserve",
  "tasks": {
    "Reserve": "shop.reserve",
    "Charge":  "shop.charge",
    "Pack":    "shop.pack",
    "Ship":    "shop.ship"
  },
  "transitions": [
    {"from": "Reserve", "to": ["Charge", "Pack"]},
    {"from": "Charge",  "to": "Ship"},
    {"from": "Pack",    "to": "Ship"},
    {"from": "Ship",    "to": "END"}
  ],
  "fan_in": ["Ship"],
  "reducers": {"log": "append"}
}
$graph$::jsonb) AS version;

\echo
\echo '== 3. Three orders; dwarf.run creates each flow and waits (at most 30 s) for the server to finish it'
CREATE TEMP TABLE demo_runs (flow_id bigint, status text, state jsonb, error text);

INSERT INTO demo_runs
SELECT flow_id, status, state, error
  FROM dwarf.run('checkout', '{"order": 1, "sku": "widget", "qty": 2, "price": 9.99}', timeout => '30 s')
RETURNING flow_id, status, error;

INSERT INTO demo_runs
SELECT flow_id, status, state, error
  FROM dwarf.run('checkout', '{"order": 2, "sku": "gadget", "qty": 1, "price": 24.50}', timeout => '30 s')
RETURNING flow_id, status, error;

INSERT INTO demo_runs
SELECT flow_id, status, state, error
  FROM dwarf.run('checkout', '{"order": 3, "sku": "widget", "qty": 3, "price": 9.99}', timeout => '30 s')
RETURNING flow_id, status, error;

\echo
\echo 'Status of each flow, and what its final state says:'
SELECT flow_id, status, state->'log' AS log, state->>'amount' AS amount,
       state->>'tracking' AS tracking, error
  FROM demo_runs
 ORDER BY flow_id;

SELECT min(flow_id) AS first_flow FROM demo_runs \gset
\echo
\echo 'The final state of the first flow (flow' :first_flow'):'
\pset tuples_only on
\pset format unaligned
SELECT jsonb_pretty(state) FROM demo_runs WHERE flow_id = :first_flow;
\pset format aligned
\pset tuples_only off

\echo
\echo '== 4. What ran in the first flow: dwarf.history, one row per step; Charge and Pack are the two branches of the fork'
SELECT * FROM dwarf.history(:first_flow);

\echo
\echo '== 5. The shop tables: every step wrote exactly once'
SELECT o.order_id, o.sku, o.qty, o.status,
       (SELECT count(*) FROM shop.payments p WHERE p.order_id = o.order_id) AS payments,
       (SELECT count(*) FROM shop.shipments s WHERE s.order_id = o.order_id) AS shipments,
       (SELECT string_agg(s.tracking, ', ') FROM shop.shipments s WHERE s.order_id = o.order_id) AS tracking
  FROM shop.orders o
 ORDER BY o.order_id;

SELECT 'orders' AS "table", count(*) AS "rows" FROM shop.orders
UNION ALL SELECT 'payments', count(*) FROM shop.payments
UNION ALL SELECT 'shipments', count(*) FROM shop.shipments
UNION ALL SELECT 'shipments shipped', count(*) FROM shop.shipments WHERE shipped_at IS NOT NULL;

SELECT sku, on_hand AS "on hand (was widget 10, gadget 5)" FROM shop.stock ORDER BY sku;

-- The verdict: raise (and so fail psql) unless everything above is as claimed.
DO $$
DECLARE
	problems text[] := '{}';
	r record;
BEGIN
	IF (SELECT count(*) FROM demo_runs) <> 3 THEN
		problems := problems || 'expected 3 flows'::text;
	END IF;
	FOR r IN SELECT * FROM demo_runs ORDER BY flow_id LOOP
		IF r.status IS DISTINCT FROM 'completed' THEN
			problems := problems || format('flow %s is %s%s', r.flow_id,
			                               coalesce(r.status, 'unknown'),
			                               coalesce(': ' || r.error, ''));
		END IF;
	END LOOP;
	IF (SELECT count(*) FROM shop.orders) <> 3
	   OR EXISTS (SELECT FROM shop.orders o
	               WHERE o.status <> 'shipped'
	                  OR (SELECT count(*) FROM shop.payments p WHERE p.order_id = o.order_id) <> 1
	                  OR (SELECT count(*) FROM shop.shipments s
	                       WHERE s.order_id = o.order_id AND s.shipped_at IS NOT NULL) <> 1)
	   OR (SELECT count(*) FROM shop.payments) <> 3
	   OR (SELECT count(*) FROM shop.shipments) <> 3 THEN
		problems := problems || 'the shop tables do not show exactly one write per step'::text;
	END IF;
	IF cardinality(problems) > 0 THEN
		RAISE EXCEPTION 'demo failed: %', array_to_string(problems, '; ');
	END IF;
END
$$;

\echo
\echo 'OK: 3 flows completed, and each step wrote exactly once.'
