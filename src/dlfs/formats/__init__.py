"""Byte formats both sides speak: data-path frames, gRPC reply chunks, the on-disk layout,
block CRCs, the ingest digest.
"""
