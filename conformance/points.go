package conformance

import (
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/tensorlane/tensorlane/internal/netns"
)

// Probes of what a check needs.
var (
	needRoot = func() error { return netns.Available() }
	needGCC  = func() error { _, err := exec.LookPath("gcc"); return err }
	needOFI  = func() error {
		if _, err := exec.LookPath("fi_info"); err != nil {
			return errors.New("libfabric (libfabric-dev, libfabric-bin) is not installed")
		}
		return nil
	}
	needVenv = func() error {
		if _, err := os.Stat(".venv/bin/pytest"); err != nil {
			return errors.New("no .venv with pytest (scripts/deps.sh makes it)")
		}
		return nil
	}
	needGPU = func() error {
		if _, err := os.Stat("/dev/nvidiactl"); err != nil {
			return errors.New("no NVIDIA GPU (/dev/nvidiactl)")
		}
		return nil
	}
	needHIP = func() error {
		if _, err := os.Stat("tensor/hip"); err != nil {
			return errors.New("no tensor/hip in this checkout")
		}
		return needGCC()
	}
	never = func(what string) func() error { return func() error { return fmt.Errorf("needs %s", what) } }
)

// soakCheck and faultMatrix are beta evidence shared by several points.
var (
	soakCheck   = Check{Level: Beta, Name: "soak", Cmd: goTest("./cmd/internal/soak/", "TestSoakShort")}
	faultMatrix = Check{Level: Beta, Name: "fault-matrix", Cmd: goTest("./internal/multihost/", "."),
		Env: []string{"TENSORLANE_FAULT_MATRIX=full"}, Needs: "root (network namespaces)", Probe: needRoot}
)

// Points lists every built-in plug-in point but the device plugins, which
// topology/topocheck verifies in process (DevicePlugin points come from
// topology.DefaultPlugins). The declared levels are the project's claims;
// the checks are what backs them.
func Points() []Point {
	ofiEnv := []string{"IPATH_NO_BACKTRACE=1", "TENSORLANE_RDMA_PROVIDER=ofi", "FI_PROVIDER=net"}
	return []Point{
		{Kind: DeviceBackend, Name: "simulated", Declared: Beta, Checks: []Check{
			{Level: Experimental, Name: "basics", Cmd: goTest("./tensor/", "TestDescValidate|TestCopyHostAndSim|Fuzz")},
			{Level: Alpha, Name: "memory-suite", Cmd: goTest("./tensor/", ".")},
			soakCheck,
			{Level: Stable, Name: "n/a", Needs: "nothing more: simulated memory has no hardware to pass on", Probe: never("a release record")},
		}},
		{Kind: DeviceBackend, Name: "cuda", Declared: Alpha, Checks: []Check{
			{Level: Experimental, Name: "fake-driver", Cmd: []string{"go", "test", "-count=1", "./tensor/cuda/"},
				Env: []string{"CGO_ENABLED=0"}, Needs: "gcc (builds the fake libcuda)", Probe: needGCC},
			{Level: Alpha, Name: "gpucheck-dry-run", Cmd: []string{"bash", "-c", `set -e; d=$(mktemp -d); trap 'rm -rf "$d"' EXIT; gcc -shared -fPIC -O1 -o "$d/libcuda.so.1" tensor/cuda/testdata/fakecuda.c; TENSORLANE_LIBCUDA=$d/libcuda.so.1 GPUCHECK_MIB=4 GPUCHECK_ROUNDS=2 GPUCHECK_NO_GOALS=1 CGO_ENABLED=0 go test -count=1 -tags gpu ./tensor/cuda/gpucheck/`},
				Needs: "gcc", Probe: needGCC},
			{Level: Beta, Name: "gpu-soak", Needs: "a GPU soak in the nightly tier (not yet)", Probe: never("a GPU soak")},
			{Level: Stable, Name: "gpu-check", Cmd: []string{"bash", "scripts/gpu-check.sh"}, Needs: "an NVIDIA GPU", Probe: needGPU},
		}},
		{Kind: DeviceBackend, Name: "hip", Declared: Alpha, Checks: []Check{
			{Level: Experimental, Name: "fake-driver-basics", Cmd: []string{"go", "test", "-count=1", "-run", "TestLoadRefuses|TestNoDevice", "./tensor/hip/"},
				Needs: "tensor/hip in this checkout, gcc (builds the fake libamdhip64)", Probe: needHIP},
			{Level: Alpha, Name: "fake-driver-suite", Cmd: []string{"go", "test", "-count=1", "./tensor/hip/"}, Needs: "tensor/hip, gcc", Probe: needHIP},
			{Level: Beta, Name: "gpu-soak", Needs: "a GPU soak in the nightly tier (not yet)", Probe: never("a GPU soak")},
			{Level: Stable, Name: "amd-gpu", Needs: "a run on AMD GPUs (not yet scripted)", Probe: never("an AMD GPU run")},
		}},
		{Kind: Transport, Name: "local", Declared: Beta, Checks: []Check{
			{Level: Experimental, Name: "basics", Cmd: goTest("./fabric/local/", "TestLocalAndP2P")},
			{Level: Alpha, Name: "fabrictest", Cmd: goTest("./fabric/local/", "TestConformance")},
			soakCheck,
			{Level: Stable, Name: "gpu-check", Cmd: []string{"bash", "scripts/gpu-check.sh"}, Needs: "NVIDIA GPUs (device-to-device copies)", Probe: needGPU},
		}},
		{Kind: Transport, Name: "shm", Declared: Beta, Checks: []Check{
			{Level: Experimental, Name: "abuse+fuzz", Cmd: goTest("./fabric/shm/", "TestAbuse|Fuzz")},
			{Level: Alpha, Name: "fabrictest", Cmd: goTest("./fabric/shm/", "TestConformance")},
			soakCheck,
			{Level: Stable, Name: "gpu-check", Cmd: []string{"bash", "scripts/gpu-check.sh"}, Needs: "NVIDIA GPUs (cross-process grants of device memory)", Probe: needGPU},
		}},
		{Kind: Transport, Name: "tcp", Declared: Beta, Checks: []Check{
			{Level: Experimental, Name: "abuse+fuzz", Cmd: goTest("./fabric/tcp/", "TestAbuse|Fuzz")},
			{Level: Alpha, Name: "fabrictest", Cmd: goTest("./fabric/tcp/", "TestConformance")},
			faultMatrix,
			{Level: Stable, Name: "two-machines", Needs: "a run between two real machines", Probe: never("two machines")},
		}},
		{Kind: Transport, Name: "rdma", Declared: Beta, Checks: []Check{
			{Level: Experimental, Name: "abuse+fuzz", Cmd: goTest("./fabric/rdma/", "Abuse|Malformed|Fuzz")},
			{Level: Alpha, Name: "fabrictest", Cmd: goTest("./fabric/rdma/", "TestConformance|TestStripe")},
			{Level: Beta, Name: "rails-in-namespaces", Cmd: goTest("./fabric/rdma/", "TestNamespaces"), Needs: "root (network namespaces)", Probe: needRoot},
			faultMatrix,
			{Level: Stable, Name: "real-nics", Needs: "RDMA NICs (through the ofi provider)", Probe: never("RDMA NICs")},
		}},
		{Kind: RDMAProvider, Name: "soft", Declared: Beta, Checks: []Check{
			{Level: Experimental, Name: "abuse+fuzz", Cmd: goTest("./fabric/rdma/softrdma/", "TestAbuse|Fuzz")},
			{Level: Alpha, Name: "provider-suite", Cmd: goTest("./fabric/rdma/softrdma/", ".")},
			{Level: Beta, Name: "rails-in-namespaces", Cmd: goTest("./fabric/rdma/", "TestNamespaces"), Needs: "root (network namespaces)", Probe: needRoot},
			{Level: Stable, Name: "two-machines", Needs: "a run between two real machines", Probe: never("two machines")},
		}},
		{Kind: RDMAProvider, Name: "ofi", Declared: Alpha, Checks: []Check{
			{Level: Experimental, Name: "abuse+fuzz", Cmd: goTest("./fabric/rdma/ofi/", "TestAbuse|Fuzz", "ofi"), Env: ofiEnv, Needs: "libfabric", Probe: needOFI},
			{Level: Alpha, Name: "rdma-suite-over-ofi", Cmd: goTest("./fabric/rdma/", ".", "ofi"), Env: ofiEnv, Needs: "libfabric", Probe: needOFI},
			{Level: Beta, Name: "fault-matrix-over-ofi", Needs: "the fault matrix over libfabric (not yet: tcp;ofi_rxm crashes when a peer dies, docs/rdma-ofi.md)", Probe: never("a fault matrix over ofi")},
			{Level: Stable, Name: "real-nic", Needs: "an RDMA NIC (verbs or efa provider)", Probe: never("an RDMA NIC")},
		}},
		{Kind: RayPlugin, Name: "tensorlane.ray", Declared: Alpha, Checks: []Check{
			{Level: Experimental, Name: "binding", Cmd: []string{".venv/bin/pytest", "-q", "-p", "no:cacheprovider", "python/tests/test_binding.py"}, Needs: ".venv", Probe: needVenv},
			{Level: Alpha, Name: "ray-transport", Cmd: []string{".venv/bin/pytest", "-q", "-p", "no:cacheprovider", "python/tests/test_ray.py"}, Needs: ".venv", Probe: needVenv},
			{Level: Beta, Name: "multi-node", Cmd: []string{"sh", "-c", `.venv/bin/pytest -q -p no:cacheprovider -m multinode python/tests; rc=$?; [ $rc -ne 5 ] || { echo "no multi-node cases yet (pytest -m multinode)"; exit 77; }; exit $rc`},
				Needs: ".venv and multi-node cases (pytest -m multinode)", Probe: needVenv},
			{Level: Stable, Name: "ray-cluster", Needs: "a multi-node Ray cluster on real machines", Probe: never("a Ray cluster")},
		}},
	}
}
