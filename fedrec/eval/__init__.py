"""Evaluation: ranking and rating metrics, and the loops that apply them to trained models."""
