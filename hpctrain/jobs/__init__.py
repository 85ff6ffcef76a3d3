"""The login-node side after rendering: submission (submitit), the job handle, the
one batched poller, sweeps, and the local index of what was submitted.
"""
