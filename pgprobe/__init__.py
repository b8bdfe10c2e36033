"""pgprobe: see inside running PostgreSQL backends with bpftrace and DTrace."""

__version__ = "0.1.0"
