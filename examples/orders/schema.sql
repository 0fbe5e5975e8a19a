-- An order workflow, as an application team would write it in its first
-- week with dwarf: the business tables, one SQL function per step, and the
-- graph that ties them together.  Load it with psql into a database that has
-- the dwarf extension; loading it again starts over (the schema is dropped).
--
--   Reserve -> Charge -> Approve -> Ship      (approved)
--                               \-> Reject    (not approved)
--
-- Charge has a retry policy: a serialization failure (40001) is retried up
-- to 3 attempts in all.  Approve asks a human (dwarf.interrupt) for orders
-- above 1000; the flow parks until someone resumes it.

\set ON_ERROR_STOP 1
SET client_min_messages = warning;

DROP SCHEMA IF EXISTS orders CASCADE;
CREATE SCHEMA orders;

CREATE TABLE orders.orders (
	id          bigserial PRIMARY KEY,
	customer    text NOT NULL,
	amount      numeric(12, 2) NOT NULL CHECK (amount > 0),
	-- new, reserved, charged, shipped or rejected: written by the steps
	status      text NOT NULL DEFAULT 'new',
	flow_id     bigint,
	created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per successful charge: a failed attempt's row is rolled back with
-- it, so a retried charge still charges once.
CREATE TABLE orders.payments (
	order_id    bigint PRIMARY KEY REFERENCES orders.orders,
	amount      numeric(12, 2) NOT NULL,
	step_key    text NOT NULL,
	charged_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE orders.shipments (
	order_id    bigint PRIMARY KEY REFERENCES orders.orders,
	tracking    text NOT NULL,
	shipped_at  timestamptz NOT NULL DEFAULT now()
);

-- Reserve: marks the order reserved (stock would be taken here).
CREATE FUNCTION orders.reserve(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	UPDATE orders.orders SET status = 'reserved' WHERE id = (s->>'order_id')::bigint;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'order % does not exist', s->>'order_id';
	END IF;
	RETURN jsonb_build_object('reserved', true);
END $$;

-- Charge: records the payment.  An order marked "flaky" meets a
-- serialization failure on its first attempt, which the graph's retry
-- policy retries; the attempt number comes from the flow's own history.
CREATE FUNCTION orders.charge(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	failed int := (SELECT count(*) FROM dwarf.history(dwarf.flow_id())
				    WHERE task = 'Charge' AND status = 'retry');
BEGIN
	INSERT INTO orders.payments (order_id, amount, step_key)
	VALUES ((s->>'order_id')::bigint, (s->>'amount')::numeric, dwarf.step_key());
	IF (s->>'flaky')::boolean AND failed = 0 THEN
		RAISE EXCEPTION 'card processor busy for order %', s->>'order_id'
			USING ERRCODE = 'serialization_failure';
	END IF;
	UPDATE orders.orders SET status = 'charged' WHERE id = (s->>'order_id')::bigint;
	RETURN jsonb_build_object('charged', (s->>'amount')::numeric, 'charge_attempt', failed + 1);
END $$;

-- Approve: orders up to 1000 pass on their own; a larger one parks the
-- flow until a human answers through dwarf.resume(flow, '{"ok": ..., "by": ...}').
CREATE FUNCTION orders.approve(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	answer jsonb;
BEGIN
	IF (s->>'amount')::numeric <= 1000 THEN
		RETURN jsonb_build_object('approved', true, 'approved_by', 'auto');
	END IF;
	answer := dwarf.interrupt(jsonb_build_object(
		'ask', 'approve order', 'order_id', s->'order_id',
		'customer', s->'customer', 'amount', s->'amount'));
	IF answer IS NULL THEN
		RETURN NULL;			-- parked; runs again on resume
	END IF;
	RETURN jsonb_build_object('approved', coalesce((answer->>'ok')::boolean, false),
							  'approved_by', answer->'by');
END $$;

-- Ship: records the shipment.
CREATE FUNCTION orders.ship(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	tracking text := 'TRK-' || (s->>'order_id');
BEGIN
	INSERT INTO orders.shipments (order_id, tracking) VALUES ((s->>'order_id')::bigint, tracking);
	UPDATE orders.orders SET status = 'shipped' WHERE id = (s->>'order_id')::bigint;
	RETURN jsonb_build_object('tracking', tracking);
END $$;

-- Reject: a refused order ends here (a refund would go here too).
CREATE FUNCTION orders.reject(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	UPDATE orders.orders SET status = 'rejected' WHERE id = (s->>'order_id')::bigint;
	RETURN jsonb_build_object('rejected', true);
END $$;

SELECT dwarf.define('order_flow', '{
  "tasks": {
    "Reserve": "orders.reserve",
    "Charge":  {"function": "orders.charge",
                "retry": {"attempts": 3, "initial": "200 ms", "factor": 2, "on": ["40001"]}},
    "Approve": "orders.approve",
    "Ship":    "orders.ship",
    "Reject":  "orders.reject"},
  "transitions": [
    {"chain": ["Reserve", "Charge", "Approve"]},
    {"from": "Approve", "to": "Ship",   "switch": "$.approved == true"},
    {"from": "Approve", "to": "Reject", "switch": "$.approved == false"},
    {"from": "Ship",    "to": "END"},
    {"from": "Reject",  "to": "END"}]}') AS order_flow_version;
