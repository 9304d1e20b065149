"""The read layer: the reads of sealed datasets (dataset_reads.py), batch limits, batch and
range planning, the read engine (threads, preadv, io_uring), sendfile, prefetch, warm-up,
scrub. Imports only the core.
"""
