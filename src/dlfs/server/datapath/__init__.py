"""The data-path front door: listeners, connection handlers, batch replies, uploads."""
