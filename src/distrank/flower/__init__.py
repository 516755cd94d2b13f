"""Federated evaluation across real sites on Flower (``pip install distrank[flower]``).

The same protocol as the pipeline's privacy boundary, on Flower's Message API
(``flwr`` 1.42): the ServerApp (:mod:`distrank.flower.server`) sends each site one
``query`` message with every model's generated features; the ClientApp
(:mod:`distrank.flower.site`) scores them on the site's own reference features with
the package's client scorer and replies with its scores, its row count and its
site id (and its Gaussian statistics, only if its node config allows); the server
averages with the package's client weights and writes the tidy table of
``distrank score``. Message layout: :mod:`distrank.flower.messages`. In secure mode
(:mod:`distrank.flower.secure`) the server learns only sums over the sites.

Importing this package puts secure mode's mask generator (:mod:`distrank.flower.masks`)
in place in Flower's SecAgg+ mod and workflow, on the server and on every site.

``APP_DIR`` is the Flower app project to give ``flwr run`` (its pyproject.toml names
the two apps and declares the run config); ``python -m distrank.flower`` prints it.
"""

from pathlib import Path

from distrank.flower import masks

masks.install()
APP_DIR = Path(__file__).with_name("app")

__all__ = ["APP_DIR"]
