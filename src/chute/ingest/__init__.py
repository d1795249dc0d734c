"""The convert stage: a dataset as people have it -> verified TFRecord shards and a manifest.

``sources`` scans it (one module per kind: folders, lists, arrays, archives,
WebDataset, Parquet), ``split`` assigns items, ``plan`` resolves the image spec
and the shards, worker processes ``decode`` and ``encode`` them, the ``writer``
writes shards atomically, ``resume`` keeps what an interrupted run finished,
``convert`` runs it all and ``verify`` checks it.
"""
