"""hpctrain for the training frameworks most users bring: what a loop written against
:mod:`hpctrain.runtime` gets (progress for the hang watchdog, ``status`` and ``report``; an
emergency save on every stop; the exit the supervisor requeues), for a framework's own loop.

- :mod:`hpctrain.integrations.lightning`: ``HpctrainCallback`` for PyTorch Lightning
  (``pip install hpctrain[lightning]``);
- :mod:`hpctrain.integrations.transformers`: ``HpctrainCallback`` for the Hugging Face
  Trainer (``pip install hpctrain[transformers]``).

Each works with the process group the framework makes and saves the framework's own
checkpoint, which the framework's own resume line loads. Importing this package imports no
framework; each module imports its own when it is imported.
"""
