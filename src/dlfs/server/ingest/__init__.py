"""Ingest: the state machine that owns every transition of an ingest (ingest_machine.py),
its registry of states, the sessions that receive a dataset, checkpoints, and prepared
ingests found at restart. Imports only the core.
"""
