"""The weight-update process group, both sides: learner rank 0 (rank 0 of the group, hosting its
store) and every rollout server (the dev server; SGLang builds the same group in its own code).

It lives beside the default process group, as SGLang's `init_custom_process_group` builds it: one
TCP store hosted by rank 0, keys prefixed with the group's name. Rank 0 binds the store to
`master_address` only (127.0.0.1 by default), never to all interfaces.

    sock = bind_listen_socket("127.0.0.1")                          # learner rank 0, first
    pg = init_update_group("127.0.0.1", sock.getsockname()[1], 0, world, "wu", "gloo", 600, sock)
    pg = init_update_group(addr, port, rank, world, "wu", "gloo", 600)   # a server, rank >= 1
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world


def bind_listen_socket(address: str) -> socket.socket:
    """A listening TCP socket on `address` (a free port), for the group's store to adopt."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    sock.listen(128)
    return sock


def init_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
    listen_sock: socket.socket | None = None,
) -> Any:
    """Join the group as `rank`; blocks until all `world_size` ranks joined. Rank 0 hosts the
    store, on `listen_sock` when given (the caller keeps it open as long as the group lives)."""
    timeout = timedelta(seconds=timeout_s)
    kw: dict[str, Any] = {}
    if rank == 0 and listen_sock is not None:
        kw["master_listen_fd"] = listen_sock.fileno()
    store = dist.TCPStore(master_address, master_port, world_size, rank == 0, timeout=timeout, **kw)
    prefixed = PrefixStore(group_name, store)
    pg = _new_process_group_helper(
        world_size, rank, [], backend, prefixed, group_name=group_name, timeout=timeout
    )
    pg = pg[0] if isinstance(pg, tuple) else pg
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg
