#!/usr/bin/env python3
"""An order service on dwarf, as a team would write it in its first week.

It drives the order_flow graph of schema.sql (load that first) through the
four things such a service does:

  1. outbox create: an order row and its flow created in one transaction
     (dwarf.create), so there is never an order without its flow or the
     other way round (one order's transaction rolls back: no flow either);
  2. a pool of 20 connections, each running dwarf.run for one order at a
     time, many orders at once;
  3. an approval inbox: the flows parked on dwarf.interrupt, listed with
     dwarf.list, answered with dwarf.resume;
  4. the history of one order's flow (its retried charge included).

Then it checks what happened (every flow completed, every order shipped or
rejected as decided, each flaky charge retried once by the graph's retry
policy, every approval resumed) and prints a short report.  The exit status
is 0 only when every check passed.

    python3 app.py [DSN]     (default: libpq's PGHOST, PGPORT, PGDATABASE ...)
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg2
import psycopg2.errors
from psycopg2.pool import ThreadedConnectionPool

GRAPH = "order_flow"
POOL_SIZE = 20
OUTBOX_ORDERS = 10          # created with dwarf.create, then awaited
RUN_ORDERS = 60             # run with dwarf.run through the pool
APPROVAL_ABOVE = 1000       # orders.approve asks a human above this amount
REJECT_ABOVE = 5000         # our "human" refuses orders above this amount
WAIT = "60 s"               # how long one dwarf.run or dwarf.await may wait


def order_amount(i):
    """The amount of the i-th order: mostly small, every 5th needs approval,
    every 10th is too big to be approved."""
    if i % 10 == 9:
        return 7500 + i
    if i % 5 == 4:
        return 1500 + i
    return 20 + 3 * i


def order_flaky(i):
    """Whether the i-th order's first charge meets a serialization failure
    (orders.charge raises 40001 once for it; the retry policy retries it)."""
    return i % 3 == 1


def order_input(order_id, customer, amount, flaky):
    """A flow's input document for one order."""
    return json.dumps({"order_id": order_id, "customer": customer,
                       "amount": amount, "flaky": flaky})


def outbox_create(conn, customer, amount, flaky, commit=True):
    """Creates an order row and its flow in one transaction: both commit or
    (commit=False: the caller changed its mind) neither does.  Returns
    (order id, flow id)."""
    with conn:                                  # one transaction
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders.orders (customer, amount) VALUES (%s, %s) RETURNING id",
                        (customer, amount))
            order_id = cur.fetchone()[0]
            cur.execute("SELECT dwarf.create(%s, %s::jsonb)",
                        (GRAPH, order_input(order_id, customer, amount, flaky)))
            flow_id = cur.fetchone()[0]
            cur.execute("UPDATE orders.orders SET flow_id = %s WHERE id = %s", (flow_id, order_id))
        if not commit:
            conn.rollback()
    return order_id, flow_id


def flow_exists(conn, flow_id):
    """Whether a flow is there: dwarf.snapshot of an id one cannot see
    raises "flow N does not exist" (42704), as every function that takes a
    flow id does."""
    with conn.cursor() as cur:
        try:
            cur.execute("SELECT count(*) FROM dwarf.snapshot(%s)", (flow_id,))
            return cur.fetchone()[0] > 0
        except psycopg2.errors.UndefinedObject:
            return False
        finally:
            conn.rollback()


def with_pooled(pool, fn, *args):
    """Runs fn(conn, *args) on a connection of the pool, in autocommit."""
    conn = pool.getconn()
    try:
        conn.autocommit = True
        return fn(conn, *args)
    finally:
        pool.putconn(conn)


def run_order(conn, customer, amount, flaky):
    """Inserts an order and runs its flow with dwarf.run, which waits in the
    server until the flow completes, fails or parks for approval.  Returns
    (order id, outcome)."""
    with conn.cursor() as cur:
        cur.execute("INSERT INTO orders.orders (customer, amount) VALUES (%s, %s) RETURNING id",
                    (customer, amount))
        order_id = cur.fetchone()[0]
        cur.execute("SELECT flow_id, status, state, error FROM dwarf.run(%s, %s::jsonb, timeout => %s)",
                    (GRAPH, order_input(order_id, customer, amount, flaky), WAIT))
        outcome = cur.fetchone()
        cur.execute("UPDATE orders.orders SET flow_id = %s WHERE id = %s", (outcome[0], order_id))
    return order_id, outcome


def await_flow(conn, flow_id):
    """Waits in the server for a flow to close or park; returns its outcome
    (flow_id, status, state, error)."""
    with conn.cursor() as cur:
        cur.execute("SELECT flow_id, status, state, error FROM dwarf.await(%s, %s)", (flow_id, WAIT))
        return cur.fetchone()


def pending_approvals(conn, page=50):
    """The approval inbox: every flow of the graph parked on an interrupt,
    oldest first, with its interrupt payload.  dwarf.list pages by flow id
    (newest first, "before" is the cursor) and returns the payload."""
    inbox = []
    before = None
    with conn.cursor() as cur:
        while True:
            cur.execute("SELECT flow_id, interrupt_payload FROM dwarf.list(graph => %s, status => %s,"
                        " before => %s, page_size => %s)",
                        (GRAPH, "interrupted", before, page))
            rows = cur.fetchall()
            inbox.extend(rows)
            if len(rows) < page:
                break
            before = rows[-1][0]
    inbox.reverse()
    return inbox


def decide(payload):
    """Our stand-in for a human: approves up to REJECT_ABOVE."""
    return {"ok": float(payload["amount"]) <= REJECT_ABOVE, "by": "alice"}


def resume(conn, flow_id, answer):
    """Answers one approval: the parked task runs again and its
    dwarf.interrupt call returns the answer."""
    with conn.cursor() as cur:
        cur.execute("SELECT dwarf.resume(%s, %s::jsonb)", (flow_id, json.dumps(answer)))


def history(conn, flow_id):
    """One row per step attempt of a flow: (task, status, attempt, error)."""
    with conn.cursor() as cur:
        cur.execute("SELECT task, status, attempt, error FROM dwarf.history(%s)", (flow_id,))
        return cur.fetchall()


class Checks:
    """Collects the outcomes of the app's checks."""

    def __init__(self):
        self.failed = []
        self.passed = 0

    def check(self, ok, what):
        """Records one check; a failed one is printed at once."""
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
            print("FAILED: " + what)


def create_outbox_orders(conn, checks, orders):
    """Part 1: the outbox orders, and one that is rolled back."""
    for i in range(OUTBOX_ORDERS):
        amount, flaky = order_amount(i), order_flaky(i)
        order_id, flow_id = outbox_create(conn, "outbox-%d" % i, amount, flaky)
        orders[order_id] = {"amount": amount, "flaky": flaky, "flow": flow_id}
    order_id, flow_id = outbox_create(conn, "changed-mind", 99, False, commit=False)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM orders.orders WHERE id = %s", (order_id,))
        gone = cur.fetchone()[0] == 0
    conn.rollback()
    checks.check(gone and not flow_exists(conn, flow_id),
                 "a rolled-back outbox transaction left neither its order nor its flow")


def run_through_pool(pool, orders):
    """Part 2: the outbox flows awaited and RUN_ORDERS more orders run with
    dwarf.run, at once on a pool of POOL_SIZE connections.  Returns each
    order's outcome and the time it all took."""
    outcomes = {}
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=POOL_SIZE) as ex:
        awaited = {ex.submit(with_pooled, pool, await_flow, o["flow"]): oid for oid, o in orders.items()}
        ran = [ex.submit(with_pooled, pool, run_order, "customer-%d" % i, order_amount(i), order_flaky(i))
               for i in range(RUN_ORDERS)]
        for fut, oid in awaited.items():
            outcomes[oid] = fut.result()
        for i, fut in enumerate(ran):
            oid, outcome = fut.result()
            orders[oid] = {"amount": order_amount(i), "flaky": order_flaky(i), "flow": outcome[0]}
            outcomes[oid] = outcome
    return outcomes, time.monotonic() - t0


def answer_inbox(conn, pool, checks, orders, outcomes):
    """Part 3: the approval inbox.  Each of our parked orders is decided and
    resumed, and its flow awaited.  Returns the decisions by order id."""
    parked = {oid for oid, out in outcomes.items() if out[1] == "interrupted"}
    flow_to_order = {o["flow"]: oid for oid, o in orders.items()}
    inbox = [(f, p) for f, p in pending_approvals(conn) if f in flow_to_order]
    checks.check({flow_to_order[f] for f, _ in inbox} == parked,
                 "the inbox lists every parked order (%d of %d)" % (len(inbox), len(parked)))
    checks.check(all(p.get("order_id") == flow_to_order[f] for f, p in inbox),
                 "each inbox payload names its order")
    decisions = {}
    for flow_id, payload in inbox:
        decisions[flow_to_order[flow_id]] = decide(payload)
        resume(conn, flow_id, decisions[flow_to_order[flow_id]])
    with ThreadPoolExecutor(max_workers=POOL_SIZE) as ex:
        futs = {ex.submit(with_pooled, pool, await_flow, orders[oid]["flow"]): oid for oid in decisions}
        for fut, oid in futs.items():
            outcomes[oid] = fut.result()
    left = [f for f, _ in pending_approvals(conn) if f in flow_to_order]
    checks.check(not left, "no order of ours is left in the inbox (%d are)" % len(left))
    return decisions


def check_orders(conn, checks, orders, outcomes, decisions):
    """Every flow completed, and the tables say what the flows did: each
    order shipped or rejected as decided, charged once, shipped once."""
    not_done = {oid: out[1:] for oid, out in outcomes.items() if out[1] != "completed"}
    checks.check(not not_done, "every order's flow completed (not: %s)" % not_done)
    want = {oid: "rejected" if oid in decisions and not decisions[oid]["ok"] else "shipped" for oid in orders}
    with conn.cursor() as cur:
        cur.execute("SELECT id, status FROM orders.orders WHERE id = ANY(%s)", (list(orders),))
        have = dict(cur.fetchall())
        cur.execute("SELECT count(*) FROM orders.payments WHERE order_id = ANY(%s)", (list(orders),))
        payments = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM orders.shipments WHERE order_id = ANY(%s)", (list(orders),))
        shipments = cur.fetchone()[0]
    wrong = {oid: (have.get(oid), w) for oid, w in want.items() if have.get(oid) != w}
    checks.check(not wrong, "each order is shipped or rejected as decided (wrong: %s)" % wrong)
    shipped = sum(1 for w in want.values() if w == "shipped")
    checks.check(payments == len(orders), "one payment per order (%d for %d)" % (payments, len(orders)))
    checks.check(shipments == shipped, "one shipment per shipped order (%d for %d)" % (shipments, shipped))


def check_charges(conn, checks, orders):
    """Part 4: the history of every order's Charge: a flaky one failed once
    (a 'retry' row, attempt 1) and the retry policy ran it again (attempt 2);
    any other ran once.  Returns how many were retried."""
    wrong = {}
    retried = 0
    for oid, o in orders.items():
        charges = [(s, a) for t, s, a, _ in history(conn, o["flow"]) if t == "Charge"]
        expect = [("retry", 1), ("completed", 2)] if o["flaky"] else [("completed", 1)]
        if charges != expect:
            wrong[oid] = charges
        retried += ("retry", 1) in charges
    flaky = sum(1 for o in orders.values() if o["flaky"])
    checks.check(not wrong and retried == flaky,
                 "each flaky order's Charge retried once (%d of %d), the others' not (wrong: %s)"
                 % (retried, flaky, wrong))
    return retried


def main():
    dsn = sys.argv[1] if len(sys.argv) > 1 else ""
    checks = Checks()
    started = time.monotonic()
    orders = {}                 # order id -> {"amount", "flaky", "flow"}

    conn = psycopg2.connect(dsn)
    create_outbox_orders(conn, checks, orders)
    conn.autocommit = True

    pool = ThreadedConnectionPool(POOL_SIZE, POOL_SIZE, dsn)
    outcomes, run_secs = run_through_pool(pool, orders)
    need_approval = {oid for oid, o in orders.items() if o["amount"] > APPROVAL_ABOVE}
    parked = {oid for oid, out in outcomes.items() if out[1] == "interrupted"}
    checks.check(parked == need_approval,
                 "the orders above %d parked for approval (%d), and only they (%d parked)"
                 % (APPROVAL_ABOVE, len(need_approval), len(parked)))
    bad = {oid: out[1:] for oid, out in outcomes.items() if oid not in parked and out[1] != "completed"}
    checks.check(not bad, "the orders below the approval limit completed at once (not: %s)" % bad)

    decisions = answer_inbox(conn, pool, checks, orders, outcomes)
    pool.closeall()
    check_orders(conn, checks, orders, outcomes, decisions)
    retried = check_charges(conn, checks, orders)

    # one order's history: one that was retried and approved, if any
    shown = next((oid for oid in sorted(decisions) if orders[oid]["flaky"] and decisions[oid]["ok"]),
                 min(orders))
    rows = history(conn, orders[shown]["flow"])
    conn.close()

    print("order %d (flow %d): its history" % (shown, orders[shown]["flow"]))
    print("  %-8s %-11s %-7s %s" % ("task", "status", "attempt", "error"))
    for task, status, attempt, error in rows:
        print("  %-8s %-11s %-7d %s" % (task, status, attempt, error or ""))
    print()
    approved = sum(1 for d in decisions.values() if d["ok"])
    print("orders: %d (%d outbox, %d through a pool of %d running dwarf.run: %.1f s)"
          % (len(orders), OUTBOX_ORDERS, RUN_ORDERS, POOL_SIZE, run_secs))
    print("approvals: %d asked, %d approved, %d rejected; charges retried: %d"
          % (len(decisions), approved, len(decisions) - approved, retried))
    print("checks: %d passed, %d failed (%.1f s in all)"
          % (checks.passed, len(checks.failed), time.monotonic() - started))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
