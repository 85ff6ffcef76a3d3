"""A recorded-behaviour stand-in for torch, for the torch-free scale rehearsal
(benchmarks/rehearsal.py, tests/programs/standin_rank.py): only ``torch.distributed``'s
``all_reduce``, as a hung peer makes it behave. Never on the path of a real job."""
