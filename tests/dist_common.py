"""Helpers shared by the two-process tests (test_ddp.py, test_fsdp.py)."""
import socket


def free_port() -> int:
    """A TCP port free on the loopback interface now (the rendezvous of the gloo group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
