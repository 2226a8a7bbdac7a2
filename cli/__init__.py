"""The ``minibroker`` command line."""
