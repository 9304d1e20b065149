"""The gRPC front door: the servicer, its interceptor, message conversion, admission of long
calls.
"""
