-- soak: a failing flow without a handler: A -> Boom (raises); the flow fails.
SELECT status FROM dwarf.run('soak_fail', '{}', timeout => '30 s');
