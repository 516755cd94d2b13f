"""Snakemake entry point: one model's images (sampled from the zoo or a published
checkpoint, read from a source, degraded, or held-out real)."""

import numpy as np

from distrank import zoo
from distrank._io import logged
from distrank.data.images import load_images, save_images
from distrank.data.sources import load_source, resize_images
from distrank.zoo.checkpoints import generate_from_checkpoint
from distrank.zoo.degrade import degrade

sm = snakemake  # noqa: F821  (injected by Snakemake)

# Images per network load when a checkpoint's images are resized: FFHQ's 1024 px
# StyleGAN2-ADA makes 3 MB per image, so this bounds memory to a few GB.
CHUNK = 1000


def source_images(source, n):
    """The first n images of a source (streamed from ADM batches)."""
    images, labels = load_source({**source, "max_images": n}, paths=sm.params.paths,
                                 workers=sm.threads)
    if len(images) < n:
        raise ValueError(f"models.{sm.wildcards.model}: its source has {len(images)} images, "
                         f"fewer than n_samples={n}")
    return images, labels


def checkpoint_images(spec, n, seed):
    options = {k: spec[k] for k in ("truncation_psi", "class_idx", "num_steps") if k in spec}

    def generate(start, count):
        return generate_from_checkpoint(
            sm.input.checkpoint, sm.input.code, n=count, seed=seed + start,
            batch_size=sm.params.batch_size, device=sm.params.device,
            trust_pickles=sm.params.trust_pickles, **options)

    if "resolution" not in spec:
        return generate(0, n)
    # Image i depends only on seed + i, so chunks make the same images as one call;
    # each chunk is resized before the next is made.
    size = spec["resolution"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    images, labels = [], []
    for start in range(0, n, CHUNK):
        chunk, chunk_labels = generate(start, min(CHUNK, n - start))
        images.append(resize_images(chunk, size))
        labels.append(chunk_labels)
    return np.concatenate(images), None if labels[0] is None else np.concatenate(labels)


with logged(sm.log[0]):
    spec = dict(sm.params.spec)
    kind = spec.pop("kind")
    n, seed = sm.params.n_samples, sm.params.seed
    if kind in zoo.FAMILIES:
        state = zoo.load_state(sm.input.state)
        images, labels = zoo.sample(state, n, seed=seed, **spec)
    elif kind == "images":
        images, labels = source_images(spec["source"], n)
    elif kind == "checkpoint":
        images, labels = checkpoint_images(spec, n, seed)
    else:
        images, labels = load_images(sm.input.heldout)
        if kind != "heldout":
            (level,) = spec.values()
            images, labels = degrade(kind, images, labels, level=level, seed=seed)
    save_images(sm.output[0], images, labels, model=sm.wildcards.model, spec=dict(sm.params.spec))
