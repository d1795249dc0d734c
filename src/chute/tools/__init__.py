"""Around the stages: ``inspect``, ``report`` (plots), ``samples``, the ``demo`` and ``bench``."""
