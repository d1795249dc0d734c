"""The tf.data engine: ``plan`` (what one input pipeline reads) -> ``pipeline`` (the graph:
``shards`` read in blocks, ``batches`` shuffled and batched, ``host_augment``, ``finish``:
labels and dtype) -> ``engine`` (the dataset and its LoadInfo); ``service`` runs the
pipeline on the tf.data service's workers. Nothing here imports the Grain engine (an import
contract says so)."""
