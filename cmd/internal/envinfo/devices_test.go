package envinfo

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
	"github.com/tensorlane/tensorlane/tensor/hip"
	"github.com/tensorlane/tensorlane/topology"
)

// The device section says what each back-end's driver finds and which
// back-end a runtime would give each device of the host, and why a device
// would be simulated.
func TestDeviceSection(t *testing.T) {
	t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
	t.Setenv(hip.LibraryEnv, "/nonexistent/libamdhip64.so")
	t.Setenv("TENSORLANE_DEVICE_BACKEND", "")
	cl, err := topology.Preset("dgx-h100", 1)
	if err != nil {
		t.Fatal(err)
	}
	h := cl.Hosts[0]
	h.Simulated = false
	r := ProbeDevices(context.Background(), h)
	if r.Mode != "auto" || r.Devices["gpu:0"] != "cuda" || r.Devices["gpu:7"] != "cuda" {
		t.Errorf("report %+v", r)
	}
	var buf bytes.Buffer
	WriteDevices(&buf, r)
	out := buf.String()
	for _, want := range []string{
		"device backend mode:   auto",
		"backend cuda:          0: Fake H200 0 (tensorlane test double) (0000:18:00.0), 1 GiB, shareable fd, peers [1]",
		"backend hip:           not usable: hip: unavailable (/nonexistent/libamdhip64.so)",
		"device memory gpu:0:   cuda",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}

	// A preset host: simulated, and the line says why.
	cl2, _ := topology.Preset("mi355x", 1)
	r = ProbeDevices(context.Background(), cl2.Hosts[0])
	if v := r.Devices["gpu:3"]; !strings.HasPrefix(v, "sim (host h0 is a preset (mi355x)") {
		t.Errorf("preset device: %q", v)
	}
	// An AMD host without the HIP runtime: simulated, saying so.
	cl2.Hosts[0].Simulated = false
	r = ProbeDevices(context.Background(), cl2.Hosts[0])
	if v := r.Devices["gpu:3"]; !strings.HasPrefix(v, "sim (hip driver not usable: hip: unavailable") {
		t.Errorf("AMD without HIP: %q", v)
	}
}
