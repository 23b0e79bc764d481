"""What helps after memory ran out: :mod:`.oom` (the rule that says an exception is an
out-of-memory error, and what it asked for) and :mod:`.reruns` (memory that creeps up
when a cell is run again)."""
