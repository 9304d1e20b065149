"""The read layer: batch and range planning, the read engine (threads, io_uring), sendfile,
prefetch, warm-up, scrub. Imports only the core.
"""
