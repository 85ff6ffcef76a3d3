"""A checked spec and its layout plan rendered to an sbatch script (pure), and the
sysadmin's check of templates against the real scheduler.
"""
