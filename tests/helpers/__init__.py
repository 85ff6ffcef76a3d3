"""Importable helpers for the tests (``from helpers.<name> import ...``).

tests/ is on sys.path: tests/conftest.py is in no package, so pytest's default "prepend"
import mode puts its directory there. A program a test runs as a process imports them only
when its PYTHONPATH names tests/ (see TESTS_ON_PATH in tests/cluster/test_submit_cluster.py).
"""
