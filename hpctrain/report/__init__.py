"""What a job (or a partition) did with its GPU-time: the report, built pure from
what ``hpctrain report`` gathers, and its HTML page.
"""
