"""``python -m distrank.flower``: print the Flower app folder to give ``flwr run``."""

from distrank.flower import APP_DIR

print(APP_DIR)
