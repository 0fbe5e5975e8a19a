-- The reference: one durable one-row UPDATE per transaction, a row per client.
-- Run it at the same -c as the dwarf script it is compared with.
-- Table: bench/dwarf-bench -workload reference -setup-only (rows 1..1000)
UPDATE dwarf_bench.ref SET v = v + 1 WHERE id = :client_id + 1;
