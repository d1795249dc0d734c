"""The convert stage: a dataset as people have it -> verified TFRecord shards and a manifest.

``sources`` scans it (one module per kind: folders, lists, arrays, archives,
WebDataset, Parquet), ``split`` assigns items, ``layout`` resolves the image
spec and the shards, worker processes ``decode`` (read and probe) and ``encode``
them (each image prepared by :mod:`chute.image`), the ``writer`` is the one
shard-writing core (each record's fate, the shard's note, atomic writes) for
the local converter and ``beam``, ``resume`` keeps what an interrupted run
finished, ``convert`` runs it all (:mod:`chute.tools.verify` checks the result).
"""
