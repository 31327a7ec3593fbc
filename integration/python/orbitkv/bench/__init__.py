"""Drivers of the peer systems `orbitkv bench tiers` runs beside OrbitKV.

Each driver is a plain script run by the Go benchmark with the Python of that system's own
environment (``mooncake_driver``: scripts/install-mooncake.sh); it imports nothing else from
this package.
"""
