"""KD from kernel mean sketches: every piece of it in one place.

``maps`` (random Fourier features of the rbf kernel, a site's sketch, KD between
sketches), ``tensorsketch`` (KID's cubic kernel by TensorSketch) and ``family`` (its
metric, ``kd_sketch``, and its secure sum). Torch-free until a submodule is imported.
"""
