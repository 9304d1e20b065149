"""The client's transports: one daemon over gRPC, over its data path, co-located (direct);
the contract they share.
"""
