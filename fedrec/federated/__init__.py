"""Federated simulation: cohort-vectorised local training, uploads, aggregation, rounds."""
