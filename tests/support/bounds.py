"""How long a test waits for another process to do what it must before it calls that process
stuck: a bound for a hang, never a pace. The tests beside the multi-process runs run at nice 19
(``make test``'s pass beside), where a busy machine may give their processes a few percent of a
core, so a step that takes a second when idle may take minutes there."""

STUCK_SECONDS = 600
