"""jaxdl: the modern deep-learning training toolkit as pure JAX functions."""

__version__ = "0.1.0"
