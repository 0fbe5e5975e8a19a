-- soak: a retrying flow: Flaky calls dwarf.retry('100 ms', 2, '1 s') until its
-- attempt number reaches need (2 or 3), then Done.  Not waited for.
\set need random(2, 3)
SELECT dwarf.create('soak_retry', jsonb_build_object('need', :need::int));
