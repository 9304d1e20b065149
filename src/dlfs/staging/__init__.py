"""Staging a dataset: sources (trees, archives), the reader pool, progress. Never imports the
client.
"""
