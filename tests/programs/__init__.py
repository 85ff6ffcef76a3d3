"""Programs the tests and their jobs run as processes (by path: ``python
tests/programs/runtime_steps.py ...``, ``bash tests/programs/counter.sh ...``), and the
checkpoint workers that torch.multiprocessing.spawn children import as
``programs.ckpt_*_worker``. None of them imports the test helpers: a job runs them with
hpctrain installed and nothing of tests/ on its path."""
