package topology

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// discoverWithNVML runs discovery of the dgx-h100 fixture tree with the
// NVIDIA plugin reading NVML answers from answer (recorded shapes of what
// NVML returns on such machines) instead of the library.
func discoverWithNVML(t *testing.T, answer func(bus []string) ([]nvmlGPU, error)) *Discovery {
	t.Helper()
	plain, err := Discover(context.Background(), DiscoverConfig{Root: filepath.Join("testdata", "sysfs", "dgx-h100"), HostID: "h0"})
	require.NoError(t, err)
	var bus []string
	for _, d := range plain.Host.Devices {
		if d.Vendor == "nvidia" {
			bus = append(bus, d.BusID)
		}
	}
	require.Len(t, bus, 8)
	p := NVIDIAPlugin().(*nvidiaPlugin)
	p.nvml = func() ([]nvmlGPU, error) { return answer(bus) }
	plugins := []Plugin{p}
	for _, q := range DefaultPlugins() {
		if q.Name() != "nvidia" {
			plugins = append(plugins, q)
		}
	}
	d, err := Discover(context.Background(), DiscoverConfig{Root: filepath.Join("testdata", "sysfs", "dgx-h100"), HostID: "h0", Plugins: plugins})
	require.NoError(t, err)
	return d
}

// nvmlForm spells a sysfs PCI address the way NVML does.
func nvmlForm(bus string) string { return "0000" + strings.ToUpper(bus) }

func warningsOf(d *Discovery) string {
	var b strings.Builder
	for _, w := range d.Warnings {
		b.WriteString(w.Msg + "\n")
	}
	return b.String()
}

func TestNVMLSwitchedBoardIsAllToAll(t *testing.T) {
	d := discoverWithNVML(t, func(bus []string) ([]nvmlGPU, error) {
		var out []nvmlGPU
		for i, b := range bus {
			g := nvmlGPU{BusID: nvmlForm(b), UUID: fmt.Sprintf("GPU-%d", i)}
			for range 18 {
				g.Links = append(g.Links, nvmlLink{RemoteBusID: "00000000:AA:00.0", ToSwitch: true})
			}
			out = append(out, g)
		}
		return out, nil
	})
	h := d.Host
	assert.Len(t, h.Links, 28, "8 GPUs all-to-all")
	for _, l := range h.Links {
		assert.Equal(t, LinkNVLink, l.Kind)
		assert.Equal(t, 18, l.Lanes)
		assert.InDelta(t, 450, l.GBps, 0.01)
	}
	assert.Equal(t, "GPU-3", h.Devices[3].UUID)
	assert.NotContains(t, warningsOf(d), "NVML not used")
	assert.NotContains(t, warningsOf(d), "inferred", "NVML described the links: nothing to infer")
}

func TestNVMLDirectBridgesMakePairs(t *testing.T) {
	// Two GPUs bridged directly (as H100 NVL pairs are), the rest on PCIe only.
	d := discoverWithNVML(t, func(bus []string) ([]nvmlGPU, error) {
		out := make([]nvmlGPU, len(bus))
		for i, b := range bus {
			out[i] = nvmlGPU{BusID: nvmlForm(b)}
		}
		for range 12 {
			out[0].Links = append(out[0].Links, nvmlLink{RemoteBusID: nvmlForm(bus[1])})
			out[1].Links = append(out[1].Links, nvmlLink{RemoteBusID: nvmlForm(bus[0])})
		}
		return out, nil
	})
	require.Len(t, d.Host.Links, 1)
	l := d.Host.Links[0]
	assert.Equal(t, 12, l.Lanes, "each direct link is counted once, not from both ends")
	assert.InDelta(t, 12*25.0, l.GBps, 0.01)
}

func TestNVMLFabricCliqueNamesTheDomain(t *testing.T) {
	clique := func(bus []string, split bool) ([]nvmlGPU, error) {
		var out []nvmlGPU
		for i, b := range bus {
			f := nvmlFabric{Cluster: "0123456789abcdef0123456789abcdef", Clique: 7}
			if split && i == 5 {
				f.Clique = 8
			}
			out = append(out, nvmlGPU{BusID: nvmlForm(b), Fabric: f})
		}
		return out, nil
	}
	d := discoverWithNVML(t, func(bus []string) ([]nvmlGPU, error) { return clique(bus, false) })
	assert.Equal(t, "nvl-0123456789abcdef0123456789abcdef-7", d.Host.Labels[LabelNVLinkDomain])
	assert.Equal(t, "0123456789abcdef0123456789abcdef/7", d.Host.Devices[0].Fabric)

	d = discoverWithNVML(t, func(bus []string) ([]nvmlGPU, error) { return clique(bus, true) })
	assert.Empty(t, d.Host.Labels[LabelNVLinkDomain])
	assert.Contains(t, warningsOf(d), "different NVLink fabric cliques")
}

func TestNVMLUnavailableFallsBackToInference(t *testing.T) {
	d := discoverWithNVML(t, func([]string) ([]nvmlGPU, error) {
		return nil, fmt.Errorf("%w: ERROR_LIBRARY_NOT_FOUND", errNVMLUnavailable)
	})
	w := warningsOf(d)
	assert.Contains(t, w, "NVML not used (NVML unavailable: ERROR_LIBRARY_NOT_FOUND)")
	assert.Contains(t, w, "NVLink all-to-all (NV18) inferred")
	assert.Len(t, d.Host.Links, 28)
}

func TestNVMLUnknownGPUIsReported(t *testing.T) {
	d := discoverWithNVML(t, func(bus []string) ([]nvmlGPU, error) {
		return []nvmlGPU{{BusID: "00000000:FE:00.0", UUID: "GPU-ghost"}}, nil
	})
	assert.Contains(t, warningsOf(d), "GPU-ghost at 00000000:FE:00.0, which the PCI scan did not find")
}

// TestLiveNVML runs the real reader on this machine: with no NVIDIA driver
// (or without the nvml build tag) it must say NVML is unavailable, never
// fail or crash; with one it must name every GPU.
func TestLiveNVML(t *testing.T) {
	gpus, err := liveNVML()
	if err != nil {
		assert.True(t, errors.Is(err, errNVMLUnavailable), "%v", err)
		t.Logf("NVML here: %v", err)
		return
	}
	t.Logf("NVML here: %d GPUs", len(gpus))
	for _, g := range gpus {
		assert.NotEmpty(t, g.BusID)
	}
}

func TestNormalBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:18:00.0": "0000:18:00.0",
		"0000:18:00.0":     "0000:18:00.0",
		"00000001:AB:1F.7": "0001:ab:1f.7",
		"garbage":          "garbage",
		"":                 "",
	} {
		assert.Equal(t, want, normalBusID(in), in)
	}
}
