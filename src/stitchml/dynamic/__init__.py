"""Dynamic shapes: graphs whose sizes are known only at run time run kernels that
take sizes as arguments, one set per mapping bucket (`runner.py`)."""
