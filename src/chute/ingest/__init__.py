"""The convert stage: a dataset as people have it -> verified TFRecord shards and a manifest.

``sources`` (and ``lists``, ``arrays``) scan it, ``plan`` resolves the image
spec and the shards, ``split`` assigns items, worker processes ``decode`` and
``encode`` them, the ``writer`` writes shards atomically, ``resume`` keeps what
an interrupted run finished, ``convert`` runs it all and ``verify`` checks it.
"""
