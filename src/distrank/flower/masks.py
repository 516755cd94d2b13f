"""Secure mode's mask generator: SHAKE-256 over the whole shared secret.

SecAgg+ hides each site's vector under masks expanded from secrets: a private seed
per site (32 random bytes) and a pairwise key per pair of sites (32 bytes from
ECDH on P-384 and HKDF, as base64 text). Flower 1.42 expands them with
``secaggplus_utils.pseudo_rand_gen``, which XOR-folds the secret to 32 bits and
seeds NumPy's MT19937 with that: a server that removes the private masks (as the
protocol lets it) can search every pairwise key's 2^28 possible folds (base64
text has bits 7, 15, 23 and 31 clear) for the known entry of the vector, Flower's
weight factor, and so unmask a site of a two-site sum.

:func:`expand` instead reads the masks off SHAKE-256 (FIPS 202) of the whole
secret: 8 bytes per entry, reduced modulo the power-of-two range (uniform). Importing
:mod:`distrank.flower` puts it in place of ``pseudo_rand_gen`` where Flower's
``secaggplus_mod`` (the site) and ``SecAggPlusWorkflow`` (the server) call it, so
both ends of a distrank run use it; a secure request names it
(:data:`GENERATOR`) and a site refuses a request that names another.
"""

from __future__ import annotations

import hashlib
import importlib
import math
from collections.abc import Sequence

import numpy as np

#: the name a secure request's plan gives the mask generator both ends use
GENERATOR = "shake256/v1"
#: the Flower modules that call ``pseudo_rand_gen`` by their own global name
CALLERS = (
    "flwr.client.mod.secure_aggregation.secaggplus_mod",
    "flwr.server.workflow.secure_aggregation.secaggplus_workflow",
)
_DOMAIN = b"distrank secure mode, SecAgg+ mask, v1\x00"  # fixed length: the seed follows


def expand(seed: bytes, num_range: int, dimensions_list: Sequence[tuple[int, ...]]) -> list:
    """Masks of the given shapes, uniform in [0, ``num_range``), from all of ``seed``.

    The signature and output types of Flower's ``pseudo_rand_gen``: one int64 array per
    shape (a 0-d array for ``()``). ``num_range`` must be a power of two <= 2^63.
    """
    if not isinstance(seed, bytes) or not seed:
        raise ValueError("seed: expected non-empty bytes")
    if num_range < 2 or num_range > 1 << 63 or num_range & (num_range - 1):
        raise ValueError(f"num_range: expected a power of two in [2, 2^63], got {num_range!r}")
    sizes = [math.prod(shape) for shape in dimensions_list]
    stream = hashlib.shake_256(_DOMAIN + seed).digest(8 * sum(sizes))
    words = np.frombuffer(stream, dtype="<u8") & np.uint64(num_range - 1)
    out, start = [], 0
    for shape, size in zip(dimensions_list, sizes):
        out.append(words[start : start + size].astype(np.int64).reshape(shape))
        start += size
    return out


def install() -> None:
    """Make Flower's SecAgg+ mod and workflow draw their masks from :func:`expand`, and
    check that they do: the mod masks a one-entry vector through :func:`expand` (a
    probe records the call), and the workflow's unmasking reads the replaced name."""
    for name in CALLERS:
        module = importlib.import_module(name)
        if not hasattr(module, "pseudo_rand_gen"):
            raise ImportError(f"{name} has no pseudo_rand_gen: secure mode needs flwr 1.42.0")
        module.pseudo_rand_gen = expand
    mod, workflow = (importlib.import_module(name) for name in CALLERS)
    if not _masks_through_expand(mod) or "pseudo_rand_gen" not in (
        workflow.SecAggPlusWorkflow.unmask_stage.__code__.co_names
    ):
        raise ImportError(
            f"{CALLERS}: Flower no longer masks through pseudo_rand_gen: secure mode needs "
            "flwr 1.42.0"
        )


def _masks_through_expand(mod) -> bool:
    """Whether ``secaggplus_mod`` masks a vector with the generator in its module."""
    from flwr.common import ndarrays_to_parameters

    calls = []

    def probe(seed, num_range, shapes):
        calls.append(seed)
        return expand(seed, num_range, shapes)

    state = mod.SecAggPlusState(
        threshold=1, max_weight=1.0, clipping_range=1.0, target_range=4, mod_range=16
    )
    state.rd_seed = b"probe"
    configs = {mod.Key.CIPHERTEXT_LIST: [], mod.Key.SOURCE_LIST: []}
    mod.pseudo_rand_gen = probe
    try:
        mod._collect_masked_vectors(state, configs, 1, ndarrays_to_parameters([np.zeros(1)]))
    finally:
        mod.pseudo_rand_gen = expand
    return calls == [b"probe"]


def installed() -> bool:
    """Whether both of Flower's SecAgg+ ends draw their masks from :func:`expand`."""
    return all(importlib.import_module(name).pseudo_rand_gen is expand for name in CALLERS)
