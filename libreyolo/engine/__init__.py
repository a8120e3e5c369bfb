"""Predict pipeline and the eager model."""
