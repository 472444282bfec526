"""Helpers shared by the two-process tests (test_ddp.py, test_fsdp.py)."""
import socket


def free_port() -> int:
    """A TCP port free on the loopback interface now (the rendezvous of the gloo group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, port: int, world: int) -> None:
    """Join the two-process gloo group on the loopback interface (one thread each: the
    two processes share the machine's cores)."""
    import os

    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
