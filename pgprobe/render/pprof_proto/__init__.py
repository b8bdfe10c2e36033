"""pprof's profile.proto (the fields pgprobe writes) and its generated Python module."""
