"""A real multi-node SLURM cluster on one machine, for trying hpctrain, testing templates and tests.

``config`` renders the configuration files (pure), ``packages`` checks and installs the
Debian packages, ``daemons`` starts and stops processes by pid file, and ``cluster``
puts them together as :class:`~hpctrain.devcluster.cluster.DevCluster`.
"""
