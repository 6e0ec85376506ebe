package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorlane/tensorlane/cmd/internal/envinfo"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

// Without a driver, env says why CUDA is not usable; with one (the fake
// driver here), env lists its devices and topo shows them as GPUs with
// the driver's memory sizes.
func TestCUDAInEnvAndTopo(t *testing.T) {
	t.Setenv(cuda.LibraryEnv, filepath.Join(t.TempDir(), "libcuda.so.1"))
	var out bytes.Buffer
	envinfo.Write(&out, envinfo.Collect(context.Background(), ""))
	if !strings.Contains(out.String(), "cuda driver api:       not usable: cuda: unavailable") {
		t.Errorf("env without a driver:\n%s", out.String())
	}

	t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
	out.Reset()
	m := envinfo.Collect(context.Background(), "")
	envinfo.Write(&out, m)
	for _, want := range []string{"cuda device:           0: Fake H200 0 (tensorlane test double), 1 GiB, VMM+fd+fabric, peers [1]",
		"cuda-driver-api:       12.8", "accelerator:           1 x nvidia Fake H200 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("env lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runTopo(context.Background(), &out, &out, topoOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "GPU1 nvidia Fake H200 1 (tensorlane test double) 1 GiB 0000:19:00.0") {
		t.Errorf("topo:\n%s", out.String())
	}
}
