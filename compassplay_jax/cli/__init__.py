"""Command-line entry points besides `python -m compassplay_jax.main`: sweep, report, evaluate and
the data fetch (`python -m compassplay_jax.cli.<name>`). Nothing in the package imports them."""
