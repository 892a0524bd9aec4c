"""hpctrain: train deep-learning models on GPU supercomputers, fast and explained."""

__version__ = "0.1.0"
