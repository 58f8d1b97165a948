"""The per-device SPMD program as data, a room of its own below the partitioner and the cost
model: ``Collective`` (collective.py), the program index (program_index.py: the one reader of the
program), the combiner (combine.py, variadic.py), the collective records (records.py) and the one
reshard planner (reshard_plan.py: the steps the partitioner emits and the search prices)."""
