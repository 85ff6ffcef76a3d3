"""Submitting from a laptop: the cluster's hpctrain, reached over SSH (``--host``).

:mod:`hpctrain.remote.ssh` runs ssh and rsync; :mod:`hpctrain.remote.client` stages the
code and gives :class:`~hpctrain.remote.client.Cluster` and its job handles. The cluster's
side is :mod:`hpctrain.commands.serve`.
"""
