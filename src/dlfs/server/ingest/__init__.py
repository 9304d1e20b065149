"""Ingest sessions and their registry: receiving a dataset, checkpoints, sealing. Imports
only the core.
"""
