"""The Grain engine: ``plan`` -> ``dataset`` (batches by number over the record indexes
of ``source``, made in ``workers``) -> ``engine`` (the dataset and its LoadInfo). Nothing
here imports the tf.data engine (an import contract says so); nothing here loads
TensorFlow."""
