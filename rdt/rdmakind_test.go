//go:build !ofi

package rdt_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/topology"
)

// TestRDMAProviderKind: an unknown provider kind, and "ofi" in a build
// without libfabric, leave the rdma path off with a warning that says why
// (tcp serves other hosts), never the software provider in its place.
func TestRDMAProviderKind(t *testing.T) {
	cl, err := topology.Preset("dgx-h100", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kind string
		want string
	}{{"bogus", "unknown rdma provider"}, {"ofi", ofi.ErrNotBuiltIn.Error()}} {
		t.Run(tc.kind, func(t *testing.T) {
			var logs bytes.Buffer
			r, err := rdt.New(context.Background(), rdt.Config{Cluster: cl, Host: "h0", IgnoreEnv: true, RuntimeDir: t.TempDir(), Transports: stack.Config{RDMAProviderKind: tc.kind},
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			r.Shutdown(context.Background())
			if !strings.Contains(logs.String(), "rdma path not started") || !strings.Contains(logs.String(), tc.want) {
				t.Fatalf("RDMAProviderKind %q: the log does not say why rdma is off (want %q):\n%s", tc.kind, tc.want, logs.String())
			}
			if strings.Contains(logs.String(), "software provider") {
				t.Fatalf("RDMAProviderKind %q fell back to the software provider:\n%s", tc.kind, logs.String())
			}
		})
	}
}
