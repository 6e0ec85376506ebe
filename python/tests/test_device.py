"""Device memory from Python (tensorlane.device) against the fake CUDA
driver (tensor/cuda/testdata/fakecuda.c, built here with gcc): its "device
memory" is host memory, so these tests check the binding's logic, the C
ABI and the Go side, never a GPU (scripts/gpu-check.sh does that with torch).

Each test runs in a fresh interpreter: the Go library reads
TENSORLANE_LIBCUDA, TENSORLANE_DEVICE_BACKEND and CUDA_VISIBLE_DEVICES when
it loads, so they must be set before."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fakecuda(tmp_path_factory) -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: cannot build the fake CUDA driver")
    out = tmp_path_factory.mktemp("fakecuda") / "libcuda.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(out), str(ROOT / "tensor/cuda/testdata/fakecuda.c")], check=True)
    return str(out)


def run(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=e)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def gpu_env(lib: str, visible: str = "0,1") -> dict:
    return {"TENSORLANE_LIBCUDA": lib, "TENSORLANE_DEVICE_BACKEND": "cuda", "CUDA_VISIBLE_DEVICES": visible}


def test_empty_copy_put_get(fakecuda):
    run(
        """
        import ctypes
        import numpy as np
        import tensorlane as tl
        from tensorlane import device

        a = tl.Runtime({"sim_devices": True, "allow_transports": ["shm", "tcp"]})
        b = tl.Runtime({"sim_devices": True, "allow_transports": ["shm", "tcp"]})
        x = np.arange(300_000, dtype=np.float32)
        d = device.empty(x.shape, np.float32, "cuda:0", runtime=a)
        assert d.device == "cuda:0" and d.nbytes == x.nbytes and d.__dlpack_device__() == (2, 0)
        device.copy(x, d)                       # host -> device
        np.testing.assert_array_equal(d.numpy(), x)

        # DLPack: a consumer sees the device, pointer, shape and dtype.
        info = device.dlpack_info(d)
        assert info.device == (2, 0) and info.ptr == d.ptr and info.shape == x.shape and info.dtype == "float32"

        ref = device.put(d)                    # in place: no copy
        assert a.stats()["zero_copy_puts"] == 1, a.stats()
        out = device.empty(x.shape, np.float32, "cuda:1", runtime=b)
        device.get_into(ref, out)              # device -> device, another runtime
        np.testing.assert_array_equal(out.numpy(), x)
        h = np.zeros_like(x)
        device.get_into(ref, h, runtime=b)     # device -> host
        np.testing.assert_array_equal(h, x)

        # A foreign DLPack producer on the device (here another runtime's
        # array standing in for a torch tensor): one device copy.
        ref2 = device.put(out, runtime=a)
        assert a.stats()["foreign_puts"] == 1, a.stats()
        np.testing.assert_array_equal(b.get(ref2), x)
        for r in (ref, ref2):
            a.free(r)
        d.free(); d.free(); out.free()

        # Typed errors.
        for bad, kind in ((lambda: device.empty(4, np.float32, "rocm:0", runtime=a), tl.UnknownDevice),
                          (lambda: device.empty(4, np.float32, "tpu:0", runtime=a), tl.InvalidArgument),
                          (lambda: device.copy(x, device.empty(3, np.float32, "cuda:0", runtime=a)), tl.InvalidArgument)):
            try:
                bad()
            except kind:
                pass
            else:
                raise AssertionError(f"no {kind.__name__}")
        a.close(); b.close()
        print("ok")
        """,
        gpu_env(fakecuda),
    )


def test_simulated_runtime_refuses_device_pointers(fakecuda):
    p = run(
        """
        import numpy as np
        import tensorlane as tl
        from tensorlane import device
        a = tl.Runtime({"sim_devices": True})
        try:
            device.empty(4, np.float32, "cuda:0", runtime=a)
        except tl.UnknownDevice as e:
            print(e)
        else:
            raise AssertionError("a simulated GPU handed out a device pointer")
        """,
        {"TENSORLANE_LIBCUDA": fakecuda, "TENSORLANE_DEVICE_BACKEND": "", "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert "gpu:0=sim" in p.stdout and "TENSORLANE_DEVICE_BACKEND=cuda" in p.stdout


def test_two_processes(fakecuda, tmp_path):
    """One process publishes device memory; another, with another GPU, reads
    it by importing the allocation's handle (p2p across processes)."""
    ref_file = tmp_path / "ref"
    done = tmp_path / "done"
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
        import time, numpy as np, tensorlane as tl
        from tensorlane import device
        rt = tl.Runtime({{"sim_devices": True}})
        d = device.empty((1 << 20,), np.uint8, "cuda:0", runtime=rt)
        device.copy(np.arange(1 << 20, dtype=np.uint8), d)
        ref = device.put(d)
        open({str(ref_file)!r} + ".tmp", "wb").write(bytes(ref))
        import os; os.rename({str(ref_file)!r} + ".tmp", {str(ref_file)!r})
        deadline = time.time() + 60
        while not os.path.exists({str(done)!r}) and time.time() < deadline:
            time.sleep(0.05)
        rt.close()
        """)],
        env={**os.environ, **gpu_env(fakecuda, "0")},
    )
    try:
        p = run(
            f"""
            import os, time, numpy as np, tensorlane as tl
            from tensorlane import device
            deadline = time.time() + 60
            while not os.path.exists({str(ref_file)!r}) and time.time() < deadline:
                time.sleep(0.05)
            ref = open({str(ref_file)!r}, "rb").read()
            rt = tl.Runtime({{"sim_devices": True}})
            out = device.empty((1 << 20,), np.uint8, "cuda:0", runtime=rt)
            device.get_into(ref, out)
            np.testing.assert_array_equal(out.numpy(), np.arange(1 << 20, dtype=np.uint8))
            print(",".join(rt.stats()["gets_by_transport"]))
            rt.release(ref)
            rt.close()
            open({str(done)!r}, "w").close()
            """,
            gpu_env(fakecuda, "1"),
        )
        assert p.stdout.strip().splitlines()[-1] == "p2p", p.stdout
    finally:
        done.touch()
        owner.wait(timeout=60)
    assert owner.returncode == 0


def test_raycuda_without_torch_gpu():
    """The Ray transport's GPU helpers register cpu only without a torch
    GPU, and refuse what is not a torch GPU tensor with a typed error."""
    import numpy as np

    from tensorlane import _raycuda, errors

    try:
        import torch  # noqa: F401

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    assert _raycuda.devices() == (["cpu", "cuda"] if has_gpu else ["cpu"])
    assert not _raycuda.is_device_tensor(np.zeros(3))
    with pytest.raises(errors.InvalidArgument):
        _raycuda.put(None, np.zeros(3))  # type: ignore[arg-type]


def test_parse_device():
    from tensorlane import device, errors

    assert device.parse_device("cuda:3") == (2, 3)
    assert device.parse_device("rocm:1") == device.parse_device("hip:1") == (10, 1)
    assert device.parse_device("cpu") == (1, 0)
    assert device.parse_device((2, 5)) == (2, 5)
    for bad in ("tpu:0", "cuda:x", "cuda:-1"):
        with pytest.raises(errors.InvalidArgument):
            device.parse_device(bad)
