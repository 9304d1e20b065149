"""The storage core: extents, catalog and its records, replay, the sample directory, read
leases. No network; imports nothing else of the server.
"""
