"""Around the stages: ``inspect``, ``verify``, ``grid`` (a dataset's sample images),
``samples``, the ``demo`` and ``bench``."""
