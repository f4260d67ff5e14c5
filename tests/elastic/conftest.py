"""Fixtures of the elastic tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def group():
    """A one-member gloo group (this process) for a core replica: the process group is made here and destroyed
    after the test."""
    import torch.distributed as dist

    from libra.elastic.wire import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.new_group([0])
    dist.destroy_process_group()


@pytest.fixture
def pair():
    """Two `TcpLink`s over a socketpair (AF_UNIX: the TCP_NODELAY of `TcpLink.__init__` is skipped)."""
    import socket
    import threading

    from libra.elastic.wire import TcpLink

    a, b = socket.socketpair()
    la, lb = TcpLink.__new__(TcpLink), TcpLink.__new__(TcpLink)
    for link, sock in ((la, a), (lb, b)):
        link._sock, link._fault, link._send_lock, link.backend = sock, (lambda _: None), threading.Lock(), "auto"
    yield la, lb
    la.close()
    lb.close()


@pytest.fixture(scope="module")
def ext():
    """The C++ pack extension (ext/libra_ext), built or loaded once per module."""
    from libra.elastic import native

    mod = native.load()
    if mod is None:
        pytest.skip(f"C++ extension not built here: {native.load_error()}")
    return mod
