"""A warm pool: sandboxes started ahead of demand, each handed whole to one rollout.

Why: a bwrap start costs tens of milliseconds of process chain (launcher, bwrap, the tool
server's interpreter and imports) and every rollout pays it in INIT and again in EVAL. A pool
moves that work off the critical path: a claim relabels a sandbox that is already answering.

- **The workspace.** A workspace is bound when bwrap starts and must keep the same path inside
  and out, so a member is started on a slot folder of its own (`pool-<pid>.<start>-<id>`
  under `slots_dir`, empty); the claim hands that folder over: it *is* the rollout's
  workspace from then on (the handle says so), filled by INIT or `prepare_eval` after the
  claim and given to the sandbox's uid like any host write (`handles.hand_over`).
- **Which specs.** Everything but the workspace is fixed at start (mounts, network, rlimits,
  cgroup limits, tmpfs sizes, environment): a *shape* is the spec without its workspace, and
  only a sandbox of the very shape asked for is handed out. Shapes are learnt from demand (a
  miss starts cold and asks the filler for that shape); at most `max_shapes`, each forgotten
  after `idle_s` without a request. Runtimes outside `POOLABLE` (Singularity may pull an
  image at start) and callers that bring their own workspace always start cold.
- **Forks.** A claim that names a prepared layer (`lower`, a GRPO group's: `sandbox.overlay`)
  takes a *fork slot* where the runtime has them (bwrap with isolated tools): a member started
  on a fork folder (upper layer + work dir) before any layer is known, with the layers folder
  (the layer's parent) staged inside; the claim names the layer and the member mounts it
  (`toolserver/attach.py`, a few milliseconds). One shape serves every group of a node, so
  it stays warm across groups, and a group asks for it while its layer is being prepared
  (`want`). Elsewhere the shape is forks of that one layer, started once the layer exists (a
  group's samples after the first in a process start warm) and dropped with the layer.
- **Isolation first.** A member is handed out once: popped under the lock, checked alive,
  relabelled on disk before it is returned; nothing ever puts it back (its rollout's release
  stops it). No tool call reaches a member before its claim (the tool server starts bash and
  Python lazily), so a claimed sandbox is as fresh as a cold one.
- **Ownership.** Unclaimed members carry `POOL_LABEL` and the pool process as their owner
  (`owner_pid` of the intent). When that process dies they are garbage: `handles.orphaned`
  holds for them, so `list_sandboxes` and the node's reaper stop them, and `slot_folders`
  lists slot folders left without a sandbox (`claim_file` maps a claimed one to its label).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.abstract import Runtime
from sandbox.node import get_runtime, is_alive, stop_handle
from sandbox.client import Sandbox
from sandbox.errors import SandboxError
from sandbox.handles import POOL_LABEL, Handle, pid_alive, write_handle
from sandbox.settings import SandboxSettings
from sandbox.overlay import fork_folder, remove_tree
from sandbox.spec import ForkSlot, Overlay, SandboxOptions, SandboxSpec
from sandbox.toolserver.procs import start_time

log = logging.getLogger(__name__)
POOLABLE = frozenset({"bwrap", "local"})  # singularity may pull an image at start: cold
SLOT = re.compile(r"^pool-(\d+)\.(\d+)-[0-9a-f]+$")
CLAIM_SUFFIX = ".claim"


@dataclass
class _Shape:
    """The members of one shape and when it was last asked for."""

    options: SandboxOptions
    runtime: str
    lower: str | None = None  # forks of this prepared layer (`sandbox.overlay`)
    layers: str | None = None  # fork slots over this layers folder (`sandbox.fork_slot`)
    groups: dict[str, list[float]] = field(default_factory=dict)  # group -> [forks to come, asked at]
    waiting: int = 0  # claims waiting for a fork slot being started (`_await_start`)
    ready: deque[tuple[float, Handle]] = field(default_factory=deque)  # (ready at, handle)
    starting: int = 0
    wanted_at: float = field(default_factory=time.monotonic)
    misses: int = 0
    claims: int = 0


def shape_key(options: SandboxOptions, runtime: str, lower: str | None = None, layers: str | None = None) -> str:
    """One string per shape: the runtime plus every option (the workspace is not one), and
    the layer a fork's workspace is copy-on-write over, or the layers folder of fork slots."""
    key = [runtime, options.model_dump(mode="json")] + ([lower] if lower else [])
    key += [{"fork_slots": layers}] if layers else []
    return json.dumps(key, sort_keys=True)


def slot_of(handle: Handle) -> str:
    """A member's slot folder: its workspace, or a fork's folder (upper layer + work dir)."""
    forked = handle.get("overlay") or handle.get("fork_slot")
    return os.path.dirname(handle["workspace"]) if forked else handle["workspace"]


def claim_file(workspace: str | os.PathLike) -> Path:
    """Beside a claimed slot folder: the label of the rollout it went to (outside the
    workspace, where the agent cannot write)."""
    return Path(str(workspace) + CLAIM_SUFFIX)


def slot_folders(slots_dir: str | os.PathLike) -> dict[str, str | None]:
    """Slot folders under `slots_dir` as {path: label}: a claimed one's rollout label, None
    for an unclaimed one whose pool process is gone (garbage unless a live sandbox uses it);
    unclaimed folders of a live pool are left out."""
    found: dict[str, str | None] = {}
    try:
        names = os.listdir(slots_dir)
    except FileNotFoundError:
        return found
    for name in names:
        match = SLOT.match(name)
        if not match:
            continue
        path = os.path.join(slots_dir, name)
        try:
            found[path] = claim_file(path).read_text().strip()
        except OSError:
            if not pid_alive(int(match[1]), int(match[2])):
                found[path] = None
    return found


def remove_slot(workspace: str | os.PathLike) -> None:
    """Delete a workspace (or a fork's folder) and, for a pool slot, its claim record."""
    remove_tree(workspace)
    try:
        claim_file(workspace).unlink()
    except OSError:
        pass


def ensure_layers_folder(layers: str) -> None:
    """The layers folder fork slots bind, made if new and searchable by a sandbox uid that is
    not its owner (root's sandboxes run as nobody: their mounter looks a layer up by name in
    it; 0711 lets it do that and no more)."""
    os.makedirs(layers, exist_ok=True)
    info = os.stat(layers)
    if info.st_uid == os.geteuid() and info.st_mode & 0o011 != 0o011:
        os.chmod(layers, (info.st_mode & 0o7777) | 0o011)


class WarmPool:
    """Keeps `size` ready sandboxes per recently wanted shape; one per process that starts
    sandboxes (a pool belongs to its process: its members die with it, see the module doc)."""

    def __init__(
        self,
        settings: SandboxSettings,
        slots_dir: str | os.PathLike,
        size: int,
        max_shapes: int = 4,
        idle_s: float = 300.0,
        max_age_s: float = 900.0,
        runtimes: Callable[[str], Runtime] | None = None,
        max_slots: int = 16,
    ) -> None:
        self.settings, self.size, self.max_slots = settings, size, max_slots
        self.slots_dir = Path(slots_dir)
        self.max_shapes, self.idle_s, self.max_age_s = max_shapes, idle_s, max_age_s
        self._runtimes: dict[str, Runtime] = {}
        self._make_runtime = runtimes or (lambda name: get_runtime(name, settings))
        self._shapes: dict[str, _Shape] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.pid = os.getpid()

    # -- claims ---------------------------------------------------------------------------
    def claim(
        self, options: SandboxOptions, runtime: str, label: str, lower: str | None = None, group: str | None = None
    ) -> Sandbox | None:
        """A ready sandbox of this shape relabelled for `label`, or None (start cold); a miss
        asks the filler for the shape. With `lower`: a fork of that prepared layer, for one
        sample of `group` (whose count of forks to come, see `want`, goes down by one)."""
        found = self._shape_for(options, runtime, lower)
        if found is None:
            return None
        key, runtime, layers = found
        counted = False
        while True:
            with self._lock:
                shape = self._want(key, options, runtime, None if layers else lower, layers)
                if not counted and group in shape.groups:
                    counted = True
                    shape.groups[group][0] -= 1
                    if shape.groups[group][0] <= 0:
                        del shape.groups[group]
                if not shape.ready and layers is not None:
                    self._await_start(shape)
                if not shape.ready:
                    shape.misses += 1
                    self._lock.notify_all()
                    return None
                _, handle = shape.ready.popleft()
                shape.claims += 1
                self._lock.notify_all()  # one to make up
            if layers is not None:  # a fork slot: mounted now, or a cold start (never retried)
                return self._hand_out(handle, label, os.path.normpath(lower or ""))
            sandbox = self._hand_out(handle, label)
            if sandbox is not None:
                return sandbox

    def _await_start(self, shape: _Shape) -> None:
        """Under the lock: wait for a fork slot being started when no other claim waits for
        it (it is ready sooner than a cold start begun now would be, and costs no second
        start), until one is ready or none is starting."""
        if shape.starting <= shape.waiting:
            return
        shape.waiting += 1
        try:
            end = time.monotonic() + self.settings.start_timeout
            while not shape.ready and shape.starting and not self._closed and time.monotonic() < end:
                self._lock.wait(0.05)
        finally:
            shape.waiting -= 1

    def want(self, options: SandboxOptions, runtime: str, layers: str, group: str = "", samples: int = 1) -> None:
        """Ask ahead for fork slots over the folder `layers`: a group's samples ask while its
        layer is prepared or waited for, so they find their slots started. The first ask of a
        `group` counts its `samples` forks to come (each claim takes one off): the shape keeps
        that many more than `size` ready until they are claimed or `idle_s` passes, at most
        `max_slots`. Nothing where forks are started per layer (they need the layer first)."""
        found = self._shape_for(options, runtime, os.path.join(layers, "-"))
        if found is None or found[2] is None:
            return
        ensure_layers_folder(found[2])
        with self._lock:
            shape = self._want(found[0], options, found[1], None, found[2])
            if group and group not in shape.groups:
                shape.groups[group] = [samples, time.monotonic()]
            elif group:
                shape.groups[group][1] = time.monotonic()
            self._lock.notify_all()

    def _shape_for(
        self, options: SandboxOptions, runtime: str, lower: str | None
    ) -> tuple[str, str, str | None] | None:
        """(shape key, runtime, layers folder of fork slots or None), or None: no pool here.
        A fork of `lower` takes a fork slot over its parent folder where the runtime has them."""
        if self.size <= 0 or self._closed:
            return None
        if runtime == "auto":  # as what it resolves to on this node
            runtime = self._runtime(runtime).name
        if runtime not in POOLABLE:
            return None
        if lower is not None and self._runtime(runtime).fork_slots_unavailable_reason() is None:
            layers = os.path.dirname(os.path.normpath(lower))
            return shape_key(options, runtime, layers=layers), runtime, layers
        return shape_key(options, runtime, lower), runtime, None

    def _want(
        self, key: str, options: SandboxOptions, runtime: str, lower: str | None = None, layers: str | None = None
    ) -> _Shape:
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = _Shape(options, runtime, lower, layers)
            self._start_filler()
        shape.wanted_at = time.monotonic()
        return shape

    def _hand_out(self, handle: Handle, label: str, layer: str | None = None) -> Sandbox | None:
        """Relabel a popped member for its rollout (the claim file first, then the handle),
        or stop it and return None when its processes are gone (checked in /proc: a ping
        would wait for the sandbox to be scheduled; an idle server that runs answers). A fork
        slot first mounts `layer` (its handle then names the overlay as a cold fork's does);
        one that cannot is stopped too (its rollout starts cold)."""
        if not (is_alive(handle) and pid_alive(handle.get("server_pid"), handle.get("server_start"))):
            log.warning("pooled sandbox %s is gone: not handed out", handle["id"])
            self._discard(handle)
            return None
        sandbox = Sandbox(handle, stop_handle)
        if layer is not None:
            try:
                sandbox.attach_layer(os.path.basename(layer))
            except SandboxError as exc:
                log.warning("fork slot %s could not take layer %s: %s", handle["id"], layer, exc)
                sandbox.close()
                self._discard(handle)
                return None
            handle["overlay"] = {"lower": layer, "work": handle.pop("fork_slot")["work"]}
        try:
            claim_file(slot_of(handle)).write_text(label)
            handle.update(label=label, claimed=time.time())
            write_handle(handle)
        except BaseException:  # e.g. a full disk: neither handed out nor left in the pool
            sandbox.close()
            self._discard(handle)
            raise
        return sandbox

    # -- the filler -----------------------------------------------------------------------
    def _start_filler(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._fill_forever, daemon=True, name="raas-sandbox-pool")
            self._thread.start()

    def _fill_forever(self) -> None:
        while True:
            with self._lock:
                job = self._next_job()
                while job is None and not self._closed:
                    self._lock.wait(1.0)
                    job = self._next_job()
                if self._closed:
                    return
            self._retire(job[1])
            if job[0] is not None:
                self._fill(*job[0])

    def _next_job(self) -> tuple[tuple[str, _Shape] | None, list[Handle]] | None:
        """Under the lock: (a shape to start one for, members to stop), or None when idle."""
        now = time.monotonic()
        stale: list[Handle] = []
        for key, shape in list(self._shapes.items()):
            while shape.ready and now - shape.ready[0][0] > self.max_age_s:
                stale.append(shape.ready.popleft()[1])
            gone = (shape.lower and not os.path.isdir(shape.lower)) or (
                shape.layers and not os.path.isdir(shape.layers)
            )
            if now - shape.wanted_at > self.idle_s or gone:
                stale += [handle for _, handle in shape.ready]
                shape.ready.clear()
                if not shape.starting:
                    del self._shapes[key]
        wanted = sorted(self._shapes.items(), key=lambda item: -item[1].wanted_at)
        for _key, shape in wanted[self.max_shapes :]:  # the least recently wanted go
            stale += [handle for _, handle in shape.ready]
            shape.ready.clear()
        for key, shape in wanted[: self.max_shapes]:
            if now - shape.wanted_at <= self.idle_s and len(shape.ready) + shape.starting < self._target(shape, now):
                shape.starting += 1
                return (key, shape), stale
        return (None, stale) if stale else None

    def _target(self, shape: _Shape, now: float) -> int:
        """Members a shape keeps ready: `size`, plus a fork slot per fork its groups still
        have to take (groups not asked about for `idle_s` are forgotten), at most `max_slots`."""
        for group, (_, asked) in list(shape.groups.items()):
            if now - asked > self.idle_s:
                del shape.groups[group]
        to_come = sum(int(left) for left, _ in shape.groups.values())
        return self.size + min(to_come, max(0, self.max_slots - self.size))

    def _fill(self, key: str, shape: _Shape) -> None:
        """Start one member of `shape` (outside the lock) and file it as ready."""
        handle = None
        try:
            handle = self._start_member(shape)
        except Exception:  # a failed warm start costs a cold start, no more
            log.exception("warm start of a %s sandbox failed", shape.runtime)
            time.sleep(1.0)  # a broken shape must not spin
        with self._lock:
            shape.starting -= 1
            if handle is not None and not self._closed and self._shapes.get(key) is shape:
                shape.ready.append((time.monotonic(), handle))
                self._lock.notify_all()
                return
        if handle is not None:
            self._discard(handle)

    def _runtime(self, name: str) -> Runtime:
        runtime = self._runtimes.get(name)
        if runtime is None:
            runtime = self._runtimes[name] = self._make_runtime(name)
        return runtime

    def _start_member(self, shape: _Shape) -> Handle:
        runtime = self._runtime(shape.runtime)
        slot = self.slots_dir / f"pool-{self.pid}.{start_time(self.pid)}-{uuid.uuid4().hex[:12]}"
        try:
            if shape.layers:  # a fork slot: its layer is mounted at its claim
                ensure_layers_folder(shape.layers)
                workspace, work = fork_folder(slot)
                fork = {"fork_slot": ForkSlot(layers=shape.layers, work=work)}
            elif shape.lower:  # a fork: its folder holds the upper layer and the work dir
                workspace, work = fork_folder(slot)
                fork = {"overlay": Overlay(lower=shape.lower, work=work)}
            else:
                slot.mkdir(parents=True)
                workspace, fork = str(slot), {}
            spec = SandboxSpec(workspace=workspace, **shape.options.model_dump(), **fork)
            return runtime.start(spec, label=POOL_LABEL).handle
        except BaseException:
            remove_slot(slot)
            raise

    def _retire(self, handles: list[Handle]) -> None:
        for handle in handles:
            self._discard(handle)

    @staticmethod
    def _discard(handle: Handle) -> None:
        """Stop an unclaimed member and delete its slot folder."""
        try:
            stop_handle(handle)
        except Exception:  # the reaper stops it once this process is gone
            log.exception("stopping pooled sandbox %s failed", handle.get("id"))
        remove_slot(slot_of(handle))

    # -- inspection and shutdown ----------------------------------------------------------
    def ready_count(self, options: SandboxOptions | None = None, runtime: str = "bwrap") -> int:
        """Members ready now (of one shape, or all)."""
        with self._lock:
            if options is None:
                return sum(len(s.ready) for s in self._shapes.values())
            shape = self._shapes.get(shape_key(options, runtime))
            return len(shape.ready) if shape else 0

    def wait_ready(
        self, options: SandboxOptions, runtime: str, count: int | None = None, timeout: float = 30.0
    ) -> bool:
        """Ask for a shape and wait until `count` (default `size`) members are ready."""
        count = self.size if count is None else count
        end = time.monotonic() + timeout
        with self._lock:
            while len(self._want(shape_key(options, runtime), options, runtime).ready) < count:
                self._lock.notify_all()
                if time.monotonic() > end or self._closed:
                    return False
                self._lock.wait(0.05)
        return True

    def stats(self) -> dict[str, int]:
        """Claims served and misses (cold starts) over all shapes, and members ready."""
        with self._lock:
            shapes = list(self._shapes.values())
            return {
                "claims": sum(s.claims for s in shapes),
                "misses": sum(s.misses for s in shapes),
                "ready": sum(len(s.ready) for s in shapes),
                "shapes": len(shapes),
            }

    def close(self, wait: bool = True) -> None:
        """Stop every unclaimed member and the filler (claimed sandboxes are their rollouts');
        `wait` for a start in flight (else the filler discards it when it is done)."""
        with self._lock:
            self._closed = True
            members = [h for s in self._shapes.values() for _, h in s.ready]
            for shape in self._shapes.values():
                shape.ready.clear()
            self._lock.notify_all()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.settings.start_timeout + 5)
        self._retire(members)


MAX_POOLS = 2  # per process: a worker has one; a process that changes settings keeps the last
_pools: OrderedDict[tuple, WarmPool] = OrderedDict()
_pools_lock = threading.Lock()


def pool_for(settings: SandboxSettings, slots_dir: str | os.PathLike, size: int, max_slots: int = 16) -> WarmPool:
    """This process's pool for these settings and slot folder (a forked child gets its own:
    members belong to the process that started them); closed at exit, or when pools for
    other settings pushed it out (at most `MAX_POOLS` per process, the least recently used go).
    `max_slots`: the most fork slots it keeps for the groups it prepares (`WarmPool.want`)."""
    key = (os.getpid(), settings.model_dump_json(), str(slots_dir), size, max_slots)
    evicted = []
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = WarmPool(settings, slots_dir, size, max_slots=max_slots)
            atexit.register(pool.close)
        _pools.move_to_end(key)
        while len(_pools) > MAX_POOLS:
            evicted.append(_pools.popitem(last=False)[1])
    for old in evicted:
        old.close(wait=False)
    return pool


def close_pools() -> None:
    """Stop this process's pools and their unclaimed members."""
    with _pools_lock:
        pools = [p for k, p in _pools.items() if k[0] == os.getpid()]
        _pools.clear()
    for pool in pools:
        pool.close()
