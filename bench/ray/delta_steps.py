"""Where a delta step's time goes, without Ray: a publisher and N readers on
two simulated hosts in one process (tcp over loopback, unshaped), a bf16
state dict after real Adam steps (fp32 master weights, std 0.02; noisy
gradients, std 1e-3), each delta publish timed (wall, and the process's
CPU: trainer and readers together) and every reader's bytes checked against
the trainer's after it.

    TENSORLANE_LIB=bin/libtensorlane.so PYTHONPATH=python \\
      python bench/ray/delta_steps.py [--total 256M] [--lr 1e-5] [--readers 1] [--steps 4] [--skip 2] [--perf out.data]

--skip Adam steps are taken before the first version (the first steps
after the optimizer starts change the most weights); --perf records the
delta steps with `perf record -g` (attached to this process only then).
"""

import argparse
import os
import signal
import subprocess
import threading
import time

import ml_dtypes
import numpy as np

import tensorlane as tl
from tensorlane import weightsync as ws

BF16 = ml_dtypes.bfloat16


def versions(n: int, tensors: int, lr: float, skip: int, steps: int):
    rng = np.random.default_rng(1)
    w = {f"l{i}": rng.standard_normal(n, dtype=np.float32) * np.float32(0.02) for i in range(tensors)}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v2 = {k: np.zeros_like(v) for k, v in w.items()}
    out = []
    for t in range(1, skip + steps + 2):
        for k in w:
            g = rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
            m[k] *= np.float32(0.9)
            m[k] += np.float32(0.1) * g
            v2[k] *= np.float32(0.999)
            v2[k] += np.float32(0.001) * g * g
            w[k] -= np.float32(lr) * (m[k] / np.float32(1 - 0.9 ** t)) / (
                np.sqrt(v2[k] / np.float32(1 - 0.999 ** t)) + np.float32(1e-8))
        if t > skip:
            out.append({k: w[k].astype(BF16) for k in w})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="256M")
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--perf")
    a = ap.parse_args()
    total = int(a.total[:-1]) << {"K": 10, "M": 20, "G": 30}[a.total[-1]] if a.total[-1] in "KMG" else int(a.total)
    host = lambda h: {"preset": "dgx-h100", "hosts": 2, "host": h, "allow_transports": ["shm", "tcp"]}  # noqa: E731
    owner, rts = tl.Runtime(host("h0")), [tl.Runtime(host("h1")) for _ in range(a.readers)]
    n = total // 2 // a.tensors
    vs = versions(n, a.tensors, a.lr, a.skip, a.steps)
    sd = {k: owner.empty(n, BF16) for k in vs[0]}
    pub = ws.WeightPublisher(runtime=owner, delta=True, busy_wait=30, timeout=120)
    rx = [ws.WeightReceiver({k: rt.empty(n, BF16) for k in sd}, name=f"r{i}", runtime=rt) for i, rt in enumerate(rts)]
    for r in rx:
        pub.join(r.handle())

    def sync():
        ths = [threading.Thread(target=lambda r=r: (r.wait(timeout=120), r.done())) for r in rx]
        t0 = time.perf_counter()
        for th in ths:
            th.start()
        res = pub.publish(sd)
        for th in ths:
            th.join()
        return res, time.perf_counter() - t0

    for k in sd:
        sd[k][:] = vs[0][k]
    sync()  # the first version, whole
    perf = None
    if a.perf:
        perf = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-p", str(os.getpid()), "-o", a.perf],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    for s, ver in enumerate(vs[1:]):
        changed = sum(int(np.count_nonzero(ver[k].view(np.uint16) != sd[k].view(np.uint16))) for k in sd) / (n * a.tensors)
        for k in sd:
            sd[k][:] = ver[k]
        c0 = time.process_time()
        res, wall = sync()
        cpu = time.process_time() - c0
        for r in rx:
            for k in sd:
                assert r._params[k].view(np.uint16).tobytes() == sd[k].view(np.uint16).tobytes(), "delta != full"
        print(f"step {s}: {100 * changed:.1f}% changed, {set(res.modes.values())} via {res.delta_via}, "
              f"{res.delta_bytes / 1e6:.1f} MB; {wall:.3f} s, process CPU {cpu:.3f} s (load {os.getloadavg()[0]:.1f})",
              flush=True)
    if perf:
        perf.send_signal(signal.SIGINT)
        perf.wait()
    for r in rx:
        r.close()
    pub.close()
    owner.close()
    for rt in rts:
        rt.close()


if __name__ == "__main__":
    main()
