"""The read stage: ``chute.load`` (``options`` -> ``plan`` -> ``pipeline`` of ``shards``,
``batches`` and ``augment``) and the ``image_dataset_from_directory`` drop-in."""
