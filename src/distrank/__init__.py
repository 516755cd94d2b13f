"""Consistent distributed ranking of generative models via kernel distances.

Scores generative models against reference data split across clients, with every
metric both centrally (D_all, pooled reference) and as a weighted average of the
clients' own scores (D_avg).
"""

__version__ = "0.1.0"
