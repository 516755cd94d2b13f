"""Training generators across clients: the paper's two dynamic experiments (E5, E7).

- :mod:`~distrank.training.fedavg`: the zoo's class-conditional GAN trained with FedAvg
  across the clients of a partition (generator and discriminator averaged with
  lambda_i = n_i / n after every round), and a central baseline with the same steps.
- :mod:`~distrank.training.mmd`: fine-tuning a trained generator with the squared-MMD
  loss of the package's own (differentiable) KD, by FedSGD, FedAvg or centrally.
- :mod:`~distrank.training.federated`: the pieces both share: the server's weighted
  average, the clients' data shards and seeds, and the device.
- :mod:`~distrank.training.resume`: checkpoints after every round in a folder that a
  failed Snakemake job does not delete; a killed job resumes from the last one and ends
  with the same final checkpoint, bit for bit on the CPU.
- :mod:`~distrank.training.evaluate`: a job's checkpoints as one bundle, and each
  checkpoint sampled and passed through the pipeline's feature step.

Every loop is seeded, shows a progress bar (:func:`distrank._progress.progress`) and
runs on CUDA when available, else on the CPU, through the same code.
"""

from __future__ import annotations

from distrank._lazy import lazy_getattr, lazy_names

_EXPORTS = {  # submodule -> the names it defines
    "resume": ("Checkpoints",),
    "federated": ("average_states", "client_shards"),
    "fedavg": ("train_cgan_fedavg", "train_cgan_central"),
    "mmd": ("finetune_mmd", "feature_gradient", "Lite0Embedding"),
    "evaluate": ("checkpoint_features", "load_bundle", "save_bundle"),
}

__all__ = lazy_names(_EXPORTS)


# PEP 562: import torch-heavy modules on first use
__getattr__ = lazy_getattr(__name__, _EXPORTS)
