"""The read stage: ``chute.load``. ``options`` (LoadOptions) and ``load`` (dispatch) over
one :class:`~chute.read.engine.Engine` protocol (plan -> build -> dataset and LoadInfo),
with two engines that never import each other: ``tf`` (the tf.data pipeline) and
``grain`` (Grain over the record indexes). Both take each input pipeline's share and steps
from ``share``, the shape and crops from ``target``, and the draws of class sampling from
``sampling``; ``augment`` names the augmentations. The ``image_dataset_from_directory``
drop-in (``dropin``) uses neither engine nor a manifest: Keras's own function checks the
arguments and lists the image files, and a tf.data pipeline of its own decodes them."""
