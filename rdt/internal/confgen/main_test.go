package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/schema"
)

const root = "../../.."

// The C header's field list, Python's Config and docs/config.md are what
// rdt/schema says now.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	stale, err := run(root, false)
	require.NoError(t, err)
	assert.Empty(t, stale, "run go generate ./rdt/schema")
}

// Golden: the generated text of a few fields, so a change of the generator's
// format is seen in review.
func TestGeneratedShapes(t *testing.T) {
	py := string(python())
	assert.Contains(t, py, "    #: Encrypt data connections")
	assert.Contains(t, py, "    encrypt_data: bool\n")
	assert.Contains(t, py, "    transfer_timeout: Union[float, str]\n")
	assert.Contains(t, py, "    slabs: Optional[bool]\n")
	assert.Contains(t, py, `    "transfer_timeout_ms": ("transfer_timeout", 0.001),`)
	md := string(docs())
	assert.Contains(t, md, "| `heartbeat_interval` | duration | 1s |  | go,json,worker | How often a watched peer is pinged, and how long one ping may take. |\n")
	assert.Contains(t, md, "| `--no-rdma` | worker | `--disable-rdma` |\n")
	assert.Contains(t, md, "| `listen`, `--listen` | json,worker | `listen_addrs`, `--listen-addrs` |\n")
	capi, err := goStruct(capiStruct)
	require.NoError(t, err)
	assert.Contains(t, string(capi), "\tEncryptData bool `json:\"encrypt_data,omitempty\"`\n")
	assert.Contains(t, string(capi), "\tVisibleDevices []int `json:\"visible_devices\"`\n")
	assert.Contains(t, string(capi), "\tStallTimeout schema.Seconds `json:\"stall_timeout,omitempty\"`\n")
	worker, err := goStruct(workerStruct)
	require.NoError(t, err)
	assert.Contains(t, string(worker), "\tHeartbeatInterval time.Duration\n")
	assert.Contains(t, string(worker), "\t// Hosts: Number of hosts in the preset cluster. Default: 3.\n")
	assert.Contains(t, md, "| `transfer_timeout_ms` | json | `transfer_timeout` (the old value was milliseconds; the new one is seconds) |\n")
}

// Every JSON field is a key of Python's Config, every field a row of the docs.
func TestEveryFieldIsGenerated(t *testing.T) {
	py, err := os.ReadFile(filepath.Join(root, "python/tensorlane/_config.py"))
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(root, "docs/config.md"))
	require.NoError(t, err)
	for _, f := range schema.Fields() {
		assert.Regexp(t, regexp.MustCompile("(?m)^\\| `"+f.Name+"` \\|"), string(md), f.Name)
		if f.In(schema.JSON) {
			assert.Regexp(t, regexp.MustCompile(`(?m)^    `+f.Name+`: `), string(py), f.Name)
		}
	}
}

// The README links the table.
func TestReadmeLinksConfig(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	assert.Contains(t, string(readme), "docs/config.md")
}
