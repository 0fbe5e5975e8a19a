-- soak: a failing task with an on_error handler: A -> Boom -on_error-> Handle;
-- the flow completes with state.handled set from state.onErr.
SELECT status FROM dwarf.run('soak_fail_handled', '{}', timeout => '30 s');
