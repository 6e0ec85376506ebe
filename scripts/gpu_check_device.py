"""The Python part of scripts/gpu-check.sh: device memory through the C ABI
and the Python package, timed against baselines measured in the same run.

  1. two processes on one GPU: the owner publishes a device tensor, the
     reader Gets it into its own device tensor (p2p: the allocation's handle
     imported), against torch's own CUDA IPC sharing (torch.multiprocessing:
     the reader copies from the shared tensor);
  2. device -> tcp -> device over loopback (both sides staging through
     pinned host memory), against raw loopback TCP of host memory;
  3. the Ray transport's GPU functions (tensorlane._raycuda put/recv)
     called directly, onto another device name than the sender's when
     there are two GPUs (no Ray needed).

With torch and a GPU it uses torch CUDA tensors; without (GPUCHECK_DRY=1,
the fake driver) DeviceArrays, skipping the torch baselines: the logic
runs, the figures mean nothing. Prints DEVICE/RESULT lines like the Go
check; exits non-zero when a check fails (or a goal, unless
GPUCHECK_NO_GOALS=1).

Environment: the caller sets TENSORLANE_LIB, PYTHONPATH and, for a dry
run, TENSORLANE_LIBCUDA; GPUCHECK_MIB (default 256), GPUCHECK_ROUNDS (10).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List

MIB = int(os.environ.get("GPUCHECK_MIB", "256"))
N = MIB << 20
ROUNDS = int(os.environ.get("GPUCHECK_ROUNDS", "10"))
DRY = os.environ.get("GPUCHECK_DRY") == "1"
NO_GOALS = os.environ.get("GPUCHECK_NO_GOALS") == "1"
failures: List[str] = []


def role_env(role: str) -> Dict[str, str]:
    """The environment of a process of this check. The Go library sees the
    environment the process started with (not later os.environ changes), so
    each role is a process started with it. Each claims the GPU in a claims
    directory of its own (two processes share one GPU on purpose)."""
    env = dict(os.environ)
    env.setdefault("TENSORLANE_DEVICE_BACKEND", "cuda")
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    env["TENSORLANE_RUNTIME_DIR"] = tempfile.mkdtemp(prefix=f"tl-gpucheck-{role}-")
    env["GPUCHECK_ROLE"] = role
    return env


def torch_gpu() -> Any:
    if DRY:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def pattern_device(tl_device: Any, torch: Any, rt: Any) -> Any:
    import numpy as np

    host = (np.arange(N, dtype=np.int64) % 251).astype(np.uint8)
    if torch is not None:
        return torch.from_numpy(host).to("cuda:0")
    d = tl_device.empty(N, np.uint8, "cuda:0", runtime=rt)
    tl_device.copy(host, d)
    return d


def check_pattern(tl_device: Any, dst: Any, torch: Any, what: str) -> None:
    import numpy as np

    want = (np.arange(N, dtype=np.int64) % 251).astype(np.uint8)
    got = dst.cpu().numpy() if torch is not None else dst.numpy()
    if not np.array_equal(got, want):
        failures.append(f"{what}: bytes differ")
        print(f"FAIL {what}: bytes differ", flush=True)


def timed(f: Callable[[], None]) -> float:
    f()  # warm: imports, mappings, staging buffers
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def result(name: str, secs: float, base_name: str, base: float, goal: float) -> None:
    gbps = N / secs / 1e9
    if base <= 0:
        print(f"RESULT {name}: {gbps:.2f} GB/s (no baseline in this run)", flush=True)
        return
    ratio = base / secs
    ok = ratio >= goal
    print(f"RESULT {name}: {gbps:.2f} GB/s, {ratio:.2f}x {base_name} ({N / base / 1e9:.2f} GB/s), goal {goal}x: "
          f"{'ok' if ok else 'MISSED'}", flush=True)
    if not ok and not NO_GOALS:
        failures.append(f"{name}: {ratio:.2f}x < {goal}x")


# ---- the owner process: publish, hand the ref over, wait.


def owner(cfg_json: str, ref_path: str, done_path: str) -> None:
    import json

    import tensorlane as tl
    from tensorlane import device

    torch = torch_gpu()
    rt = tl.Runtime(json.loads(cfg_json))
    src = pattern_device(device, torch, rt)
    ref = device.put(src, runtime=rt)
    with open(ref_path + ".tmp", "wb") as f:
        f.write(bytes(ref))
    os.rename(ref_path + ".tmp", ref_path)
    deadline = time.time() + 300
    while not os.path.exists(done_path) and time.time() < deadline:
        time.sleep(0.02)
    rt.close()


def with_owner(cfg: Dict[str, Any], body: Callable[[bytes], None]) -> None:
    import json

    d = tempfile.mkdtemp(prefix="tl-gpucheck-")
    ref_path, done_path = os.path.join(d, "ref"), os.path.join(d, "done")
    p = subprocess.Popen([sys.executable, __file__, "owner", json.dumps(cfg), ref_path, done_path], env=role_env("owner"))
    try:
        deadline = time.time() + 120
        while not os.path.exists(ref_path):
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"owner process failed (exit {p.returncode})")
            time.sleep(0.02)
        body(open(ref_path, "rb").read())
    finally:
        open(done_path, "w").close()
        p.wait(timeout=120)


# ---- baselines


def torch_ipc_baseline(torch: Any) -> float:
    """torch's own CUDA IPC: another process shares a CUDA tensor
    (torch.multiprocessing), this one copies from it into its own."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_ipc_child, args=(q, back, N))
    p.start()
    shared = q.get(timeout=120)
    dst = torch.empty(N, dtype=torch.uint8, device="cuda:0")

    def once() -> None:
        dst.copy_(shared)
        torch.cuda.synchronize()

    secs = timed(once)
    del shared
    back.put(True)
    p.join(timeout=60)
    return secs


def _ipc_child(q: Any, back: Any, n: int) -> None:
    import torch

    x = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    q.put(x)
    back.get(timeout=300)


def raw_tcp_baseline() -> float:
    """One loopback TCP stream of host memory, as the Go check measures it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    payload = memoryview(bytearray(N))
    sink = bytearray(N)

    def sender(conn: socket.socket) -> None:
        for _ in range(ROUNDS + 1):
            conn.sendall(payload)

    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    t = threading.Thread(target=sender, args=(conn,), daemon=True)
    t.start()
    view = memoryview(sink)

    def once() -> None:
        got = 0
        while got < N:
            got += cli.recv_into(view[got:], N - got)

    secs = timed(once)
    t.join(timeout=60)
    for s in (cli, conn, srv):
        s.close()
    return secs


# ---- the checks (this process is the reader)


def main() -> int:
    import tensorlane as tl
    from tensorlane import _raycuda, device

    torch = torch_gpu()
    if torch is None and not DRY:
        print("FAIL torch with CUDA is not importable here (GPUCHECK_DRY=1 runs the logic on the fake driver)")
        return 1
    print(f"DEVICE python {sys.version.split()[0]}, torch {getattr(torch, '__version__', 'absent (dry run)')}, "
          f"{MIB} MiB x {ROUNDS} rounds", flush=True)

    def dst_tensor(rt: Any) -> Any:
        if torch is not None:
            return torch.empty(N, dtype=torch.uint8, device="cuda:0")
        import numpy as np

        return device.empty(N, np.uint8, "cuda:0", runtime=rt)

    # 1. two processes on one GPU.
    ipc = torch_ipc_baseline(torch) if torch is not None else 0.0

    def p2p(ref: bytes) -> None:
        rt = tl.Runtime({"sim_devices": True})
        dst = dst_tensor(rt)
        secs = timed(lambda: device.get_into(ref, dst, runtime=rt))
        check_pattern(device, dst, torch, "cross-process device Get")
        used = ",".join(rt.stats()["gets_by_transport"])
        print(f"RESULT cross-process device Get took {used}", flush=True)
        # One GPU: the planner labels a same-device pair shm (p2p needs a
        # device link between two devices); either way the owner's
        # allocation handle is imported and the GPU copies, no host copy.
        if used not in ("p2p", "shm"):
            failures.append(f"cross-process device Get took {used}, not the allocation's handle (p2p/shm)")
        result("cross-process device Get (two processes, one GPU)", secs, "torch CUDA IPC copy", ipc, 0.8)
        rt.release(ref)
        rt.close()

    with_owner({"sim_devices": True}, p2p)

    # 2. device -> tcp -> device over loopback.
    raw = raw_tcp_baseline()

    def tcp(ref: bytes) -> None:
        rt = tl.Runtime({"sim_devices": True, "allow_transports": ["tcp"]})
        dst = dst_tensor(rt)
        secs = timed(lambda: device.get_into(ref, dst, runtime=rt))
        check_pattern(device, dst, torch, "device->tcp->device")
        result("device->tcp->device over loopback", secs, "raw loopback TCP of host memory", raw, 0.7)
        rt.release(ref)
        rt.close()

    with_owner({"sim_devices": True, "allow_transports": ["tcp"]}, tcp)

    # 3. the Ray transport's GPU functions, directly.
    if torch is not None:
        rt = tl.Runtime({"sim_devices": True})
        src = pattern_device(device, torch, rt)
        ref, meta = _raycuda.put(rt, src)
        target = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
        out = _raycuda.recv(rt, ref, meta, target)
        check_pattern(device, out, torch, f"ray transport put/recv onto {target}")
        host = _raycuda.recv(rt, ref, meta, "cpu")
        check_pattern(device, host, torch, "ray transport recv onto cpu")
        print(f"RESULT ray transport GPU functions: put on {meta['device']}, recv on {target} and cpu: "
              f"{'ok' if not failures else 'FAILED'}", flush=True)
        rt.free(ref)
        rt.close()
    else:
        print("RESULT ray transport GPU functions: skipped (needs torch)", flush=True)

    for f in failures:
        print(f"FAIL {f}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    if "GPUCHECK_ROLE" not in os.environ:  # start the reader with its environment
        r = subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=role_env("reader"))
        sys.exit(r.returncode)
    if len(sys.argv) > 1 and sys.argv[1] == "owner":
        owner(*sys.argv[2:5])
        sys.exit(0)
    sys.exit(main())
