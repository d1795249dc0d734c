"""Image preparation, shared by conversion workers, the reader and ``predict``.

One home for what turns an image file into the pixels a model sees, so that
``chute convert`` and ``chute predict`` prepare an image the same way. Two
parts, kept apart because worker processes must start in a fraction of a
second:

- **TensorFlow-free** (Pillow, OpenCV, NumPy; what workers and ``predict``
  import): ``size`` (image size arguments and the pixel limit), ``header``
  (what a file's header tells, without decoding its pixels; :class:`Rejected`),
  ``resize`` (crop, pad or stretch to a size), ``decode`` (a file to upright
  pixels in the stored mode and size: EXIF orientation, colour modes,
  DCT-scaled JPEG decoding), ``encode`` (pixels to the stored bytes: raw,
  PNG or JPEG, metadata stripped) and ``files`` (which names are images, the
  images under a folder, names as text). None of them imports TensorFlow, even
  lazily.
- **TensorFlow** (``tf_ops``): the reader's per-image decode, random-resized
  crop and centre crop, as TensorFlow ops that run inside ``tf.data``.
"""
