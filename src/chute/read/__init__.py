"""The read stage: ``chute.load`` (``plan`` -> ``graph`` of ``shards``, ``batches`` and
``augment``) and the ``image_dataset_from_directory`` drop-in."""
