"""The login-node side after rendering: submission (submitit), the job handle and its
contract (one for local and ``--host`` jobs), the one batched poller, the job view and
what ``status`` lists, results, a job's state directory, accounting for the report,
sweeps, and the local index of what was submitted.
"""
