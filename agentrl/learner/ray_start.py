"""Ray for the learner: a local instance that binds every socket it opens to 127.0.0.1, or a
cluster the user runs (`ray.address`); `start_ray` is idempotent and fails in one line.

`start_ray` sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (which makes Ray keep 127.0.0.1 as the node
address; by default it swaps in the host's routable address and its gRPC servers listen on it)
and checks afterwards that the node address is loopback and that no socket it opened listens
beyond it (`listening_sockets`). Joining a cluster, its nodes' addresses are the user's.

Before Ray starts, a file-size limit (`ulimit -f`, RLIMIT_FSIZE) below its hard limit is raised
to it, with a warning (`lift_file_size_limit`); one that stays below Ray's object store is a
one-line error: the raylet was killed creating that file and Ray said only, 30 s later, that the
node timed out during startup.
"""

from __future__ import annotations

import logging
import os
import resource
from pathlib import Path
from typing import Any

import ray
from ray._private import ray_constants

from agentrl.learner import LearnerError, RayConfig

log = logging.getLogger(__name__)


def start_ray(cfg: RayConfig | None = None, gpus: list[str] | None = None) -> None:
    """Start a loopback-only local Ray instance (or join `cfg.address`); idempotent. `gpus`: the
    GPU ids a started instance may hand out (the rest are the rollout servers')."""
    cfg = cfg or RayConfig()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Ray's raylet starts workers at nice 15: a learner rank would then lose every core it shares
    # with the dev server, the sandbox or the trainer (in async mode on a 2-core box its update
    # took 2.4 s instead of 1.3 s). Read by the raylet this process starts (not a joined cluster)
    os.environ.setdefault("RAY_worker_niceness", "0")

    if ray.is_initialized():
        return
    # Read once at `import ray`; if ray was imported before the env var was set, force it.
    ray_constants.ENABLE_RAY_CLUSTER = False
    lift_file_size_limit(None if cfg.address else cfg.object_store_mb)
    kw = _init_kwargs(cfg)
    logging.getLogger(_AUTH_LOGGER).addFilter(_not_auth_on_notice)  # once: same filter object
    before = listening_sockets()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus is not None and not cfg.address:  # Ray reads the driver's view when it starts
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        kw["num_gpus"] = len(gpus) if cfg.num_gpus is None else min(cfg.num_gpus, len(gpus))
    try:
        ray.init(**kw)
    except Exception as e:  # noqa: BLE001 - one line, whatever Ray raised
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise LearnerError(
            f"could not start Ray on 127.0.0.1 ({type(e).__name__}: {first}); check free memory "
            "and disk under /tmp/ray (or ray.temp_dir), stop stale `ray` processes, or set "
            "ray.address to a running cluster"
        ) from None
    finally:  # this process and the servers it starts keep the caller's view
        if gpus is not None and visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        elif gpus is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    if not cfg.address:  # a cluster the user started: its nodes' addresses are theirs to choose
        _check_loopback(before)


def lift_file_size_limit(object_store_mb: int | None) -> None:
    """This process's file-size limit (RLIMIT_FSIZE, `ulimit -f`, inherited by Ray and the
    learner ranks) raised from its soft value to its hard one, with a warning; a LearnerError
    when what is left is below Ray's object store, one file of `object_store_mb` MB (None:
    joining a cluster, whose raylets are not started here). A limit that stays finite above it
    is a warning: a checkpoint's shards are as large as the model."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        log.warning(
            "raised this process's file-size limit (ulimit -f, RLIMIT_FSIZE) from %s to its "
            "hard limit, %s, for Ray and the checkpoints",
            _limit(soft),
            _limit(hard),
        )
        soft = hard
    if soft == resource.RLIM_INFINITY:
        return
    if object_store_mb is not None and soft < (object_store_mb + 1) << 20:
        raise LearnerError(
            f"the file-size limit (ulimit -f, RLIMIT_FSIZE) is {_limit(soft)}, its hard limit "
            f"too; Ray's object store is one file of {object_store_mb} MB (ray.object_store_mb) "
            "and Ray dies creating it: run `ulimit -f unlimited` in the shell that starts "
            "agentrl (the hard limit only root raises: /etc/security/limits.conf), then start "
            "again"
        )
    log.warning(
        "the file-size limit (ulimit -f, RLIMIT_FSIZE) is %s: a checkpoint file larger than "
        "that (a model's weight shard) fails to write; `ulimit -f unlimited` lifts it",
        _limit(soft),
    )


def _limit(n: int) -> str:
    if n == resource.RLIM_INFINITY:
        return "unlimited"
    return f"{n:,} bytes (bash's ulimit -f: {n // 1024})"


def _init_kwargs(cfg: RayConfig) -> dict[str, Any]:
    """`ray.init`'s arguments: join `cfg.address`, or a new instance on 127.0.0.1."""
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if cfg.address:
        kw["address"] = cfg.address
    else:
        kw.update(
            address="local",  # a new instance, never a cluster `ray start` left running here
            _node_ip_address="127.0.0.1",
            num_cpus=cfg.num_cpus or os.cpu_count(),
            num_gpus=cfg.num_gpus,
            object_store_memory=cfg.object_store_mb * 1024 * 1024,
        )
        if cfg.temp_dir:
            kw["_temp_dir"] = cfg.temp_dir
    return kw


def _check_loopback(before: dict[tuple[int, str], str]) -> None:
    """After starting a local instance: its node address is 127.0.0.1 and no socket it opened
    (beyond `before`, those listening already) listens on another address; else Ray stops."""
    ip = ray.util.get_node_ip_address()
    if ip != "127.0.0.1":
        ray.shutdown()
        raise LearnerError(
            f"Ray chose node address {ip}, not 127.0.0.1; its servers would be reachable from "
            "the network. Import agentrl.learner before ray, or set "
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment"
        )
    exposed = sorted(
        addr
        for key, addr in listening_sockets().items()
        if key not in before and not _loopback(addr)
    )
    if exposed:
        ray.shutdown()
        raise LearnerError(
            f"Ray opened sockets beyond loopback ({', '.join(exposed)}); refusing to run. "
            "Check RAY_* environment overrides of the node address"
        )


# Ray turns token auth on for every new local instance (RAY_AUTH_MODE unset) and says so in a
# warning each time. Setting RAY_AUTH_MODE=token here instead is too late: `import ray` has read
# the mode, and its GCS then refuses the driver. Only that notice is dropped; "token auth is
# disabled" and every other warning still print.
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _not_auth_on_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Token authentication is enabled for this Ray")


_LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host in _LOOPBACK or host.startswith("127.")


def listening_sockets(root_pid: int | None = None) -> dict[tuple[int, str], str]:
    """(pid, socket inode) → "host:port" of every listening TCP socket held by `root_pid`
    (default: this process) or its descendants. Linux /proc only; {} elsewhere."""
    import ipaddress

    table: dict[str, str] = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # TCP_LISTEN
                continue
            hexip, hexport = f[1].split(":")
            raw = bytes.fromhex(hexip)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            table[f[9]] = f"{ip}:{int(hexport, 16)}"
    out: dict[tuple[int, str], str] = {}
    for pid in descendants(root_pid or os.getpid()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = link[8:-1] if link.startswith("socket:[") else ""
            if inode in table:
                out[(pid, inode)] = table[inode]
    return out


def descendants(root: int) -> set[int]:
    """`root` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return {root}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(pid)
    seen, todo = set(), [root]
    while todo:
        p = todo.pop()
        seen.add(p)
        todo.extend(c for c in children.get(p, ()) if c not in seen)
    return seen


def ray_running() -> bool:
    """This process is connected to a Ray (one it started, or the caller's)."""
    return ray.is_initialized()


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
