package envinfo_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/cmd/internal/envinfo"
)

// The command's golden file (cmd/tensorlane/testdata/env) pins the text
// byte for byte; this pins what Collect reads from a copied system tree.
func TestCollectFromTree(t *testing.T) {
	m := envinfo.Collect(context.Background(), "../../../topology/testdata/sysfs/mi300x")
	assert.Equal(t, "Ubuntu 22.04.4 LTS", m.Distribution)
	assert.Equal(t, "6.8.0-45-generic", m.Kernel)
	assert.Positive(t, m.Accelerators["amd MI300X-192GB"], "%v", m.Accelerators)
	assert.Equal(t, "6.2.1-112", m.Components["rocm"])
	assert.Nil(t, m.CUDA, "the driver is probed on a live machine only")
	assert.Nil(t, m.RDMAProviders, "the providers are probed on a live machine only")
	assert.NotEmpty(t, m.Go)
}

// A test binary has no version stamped and says why (issue 19.7).
func TestBuildVersionNote(t *testing.T) {
	v := envinfo.BuildVersion()
	if v.Version == "(devel)" && v.Revision == "" {
		assert.Contains(t, v.Note, "no version stamped")
	} else {
		assert.Empty(t, v.Note)
	}
	var b strings.Builder
	envinfo.Write(&b, envinfo.Manifest{Tensorlane: v})
	assert.Contains(t, b.String(), "tensorlane:")
}

func ExampleWrite() {
	envinfo.Write(os.Stdout, envinfo.Manifest{
		Kernel: "6.8.0-45-generic", Arch: "linux/amd64", Go: "go1.26.8",
		Tensorlane: envinfo.Version{Version: "v0.4.0"},
		CPUs:       8, NUMANodes: 1,
		Components: map[string]string{"nvidia-driver": "550.90.07"},
	})
	// Output:
	// kernel:                6.8.0-45-generic
	// arch:                  linux/amd64
	// go:                    go1.26.8
	// tensorlane:            v0.4.0
	// cpus:                  8 on 1 NUMA node(s)
	// accelerators:          none found
	// nvidia-driver:         550.90.07
}
