package topology

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
)

// goldenDir holds this package's golden files (go test ./topology -update
// rewrites them).
const goldenDir = "testdata/golden/"

func TestFileRoundTrip(t *testing.T) {
	for _, name := range Presets() {
		t.Run(name, func(t *testing.T) {
			c, err := Preset(name, 3)
			require.NoError(t, err)
			var buf bytes.Buffer
			require.NoError(t, Dump(&buf, c))
			first := buf.String()
			back, err := Load(&buf)
			require.NoError(t, err)
			assert.Equal(t, c, back)
			again, err := Marshal(back)
			require.NoError(t, err)
			assert.Equal(t, first, string(again))
		})
	}
}

func TestFileGolden(t *testing.T) {
	c, err := Preset("dgx-h100", 1)
	require.NoError(t, err)
	b, err := Marshal(c)
	require.NoError(t, err)
	testhelp.Golden(t, goldenDir+"dgx-h100.topo.json", b)
	back, err := LoadFile(filepath.Join("testdata", "golden", "dgx-h100.topo.json"))
	require.NoError(t, err)
	assert.Equal(t, c, back)
}

func TestFileDumpFile(t *testing.T) {
	c, err := PresetCluster("gb200-nvl72", 20, 0)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "t.json")
	require.NoError(t, DumpFile(p, c))
	back, err := LoadFile(p)
	require.NoError(t, err)
	assert.Equal(t, c, back)
	assert.Equal(t, c.Domains(), back.Domains())

	_, err = LoadFile(filepath.Join(t.TempDir(), "missing.json"))
	assert.ErrorIs(t, err, ErrBadFile)
	assert.ErrorIs(t, err, os.ErrNotExist)
	var fe *FileError
	require.True(t, errors.As(err, &fe))
	assert.Contains(t, fe.Path, "missing.json")
	assert.Error(t, Dump(&bytes.Buffer{}, nil))
}

func TestFileBad(t *testing.T) {
	head := `{"format":"tensorlane-topology","version":1,"name":"x","hosts":[`
	host := func(body string) string { return head + `{"id":"h0","numa":[{"id":0,"cpus":"0"}],` + body + `}]}` }
	tests := []struct{ name, in, msg string }{
		{"empty", ``, "EOF"},
		{"not json", `hello`, "invalid"},
		{"array", `[]`, "cannot unmarshal"},
		{"no format", `{"version":1,"hosts":[]}`, "format"},
		{"version", `{"format":"tensorlane-topology","version":2,"hosts":[]}`, "version 2"},
		{"unknown field", `{"format":"tensorlane-topology","version":1,"hostz":[]}`, "unknown field"},
		{"trailing", head + `]} {}`, "after"},
		{"null host", head + `null]}`, "null"},
		{"no id", head + `{"numa":[]}]}`, "without ID"},
		{"dup host", head + `{"id":"a"},{"id":"a"}]}`, "duplicate host"},
		{"dup numa", head + `{"id":"a","numa":[{"id":0},{"id":0}]}]}`, "NUMA"},
		{"distance", head + `{"id":"a","numa":[{"id":0,"distances":[300]}]}]}`, "distance"},
		{"neg memory", host(`"devices":[{"index":0,"memory_bytes":-1}]`), "bad memory"},
		{"neg index", host(`"devices":[{"index":-3}]`), "out of"},
		{"dup device", host(`"devices":[{"index":1},{"index":1}]`), "duplicate device"},
		{"numa -2", host(`"devices":[{"index":0,"numa":-2}]`), "NUMA"},
		{"switch loop", host(`"pcie_switches":[{"id":"a","parent":"b"},{"id":"b","parent":"a"}]`), "cycle"},
		{"switch parent", host(`"pcie_switches":[{"id":"a","parent":"zz"}]`), "unknown"},
		{"dup switch", host(`"pcie_switches":[{"id":"a"},{"id":"a"}]`), "duplicate PCIe"},
		{"device switch", host(`"devices":[{"index":0,"pcie_switch":"nope"}]`), "unknown switch"},
		{"self link", host(`"devices":[{"index":0}],"links":[{"a":0,"b":0,"kind":"nvlink"}]`), "itself"},
		{"link unknown", host(`"devices":[{"index":0}],"links":[{"a":0,"b":5,"kind":"nvlink"}]`), "unknown device"},
		{"link lanes", host(`"devices":[{"index":0},{"index":1}],"links":[{"a":0,"b":1,"lanes":-1}]`), "lanes"},
		{"nic dup", host(`"nics":[{"name":"a"},{"name":"a"}]`), "duplicate"},
		{"nic speed", host(`"nics":[{"name":"a","speed_gbps":-5}]`), "speed"},
		{"huge number", host(`"devices":[{"index":1e400}]`), "cannot unmarshal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(strings.NewReader(tt.in))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBadFile)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func FuzzLoad(f *testing.F) {
	for _, name := range Presets() {
		c, err := Preset(name, 1)
		if err != nil {
			f.Fatal(err)
		}
		b, err := Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"format":"tensorlane-topology","version":1,"hosts":[{"id":"a","pcie_switches":[{"id":"x","parent":"x"}]}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := Unmarshal(in)
		if err != nil {
			if !errors.Is(err, ErrBadFile) {
				t.Fatalf("error %v does not wrap ErrBadFile", err)
			}
			return
		}
		// Whatever loads must dump and load back to the same bytes, and be
		// safe to query.
		b1, err := Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Unmarshal(b1)
		if err != nil {
			t.Fatalf("dump of a loaded file does not load: %v\n%s", err, b1)
		}
		b2, _ := Marshal(c2)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("round trip changed the file:\n%s\n%s", b1, b2)
		}
		_ = c.Domains()
		for _, h := range c.Hosts {
			devs := h.Devices
			if len(devs) > 32 {
				devs = devs[:32]
			}
			for _, d := range devs {
				_ = h.NearestNICs(d.Index)
				for _, e := range devs {
					_ = c.PathBetween(Endpoint{h.ID, d.Index}, Endpoint{h.ID, e.Index})
				}
			}
		}
	})
}
