"""The train stage: ``config``, ``strategy``, ``models``, the run directory, ``train`` (and
the multi-worker ``loop``), ``evaluate``, ``predict``, ``export`` and ``plots`` (training
curves, confusion)."""
