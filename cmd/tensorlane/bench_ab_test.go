package main

import (
	"errors"
	"testing"

	"github.com/tensorlane/tensorlane/bench/ab"
)

// TestBenchABBadFlags: every mistake in the A/B flags is a typed error
// before anything is built or measured.
func TestBenchABBadFlags(t *testing.T) {
	self := t.TempDir() + "/missing-binary"
	for _, args := range [][]string{
		{"--head", "HEAD"},
		{"--base", self},
		{"--base", "no-such-revision-xyz", "--repo", "."},
		{"--base", "/bin/true", "--cells", "shm/pull/1MiB"},
		{"--base", "/bin/true", "--cells", "shm/sideways/1MiB/c1"},
		{"--base", "/bin/true", "--cells", "shm/pull/1MiB/c0"},
		{"--base", "/bin/true", "--head-env", "NOEQUALS"},
		{"--base", "/bin/true", "--reps", "2"},
		{"--base", "/bin/true", "--metric", "speed"},
	} {
		_, err := execCmd(t, newBenchCmd(), args...)
		if !errors.Is(err, ab.ErrBadConfig) {
			t.Errorf("bench %v: %v, want ab.ErrBadConfig", args, err)
		}
	}
}

func TestParseCell(t *testing.T) {
	c, err := parseCell("rdma/push/64MiB/c8")
	if err != nil || c != (ab.Cell{Path: "rdma", Mode: "push", Size: 64 << 20, Concurrency: 8}) {
		t.Errorf("parseCell = %+v, %v", c, err)
	}
	if c.String() != "rdma/push/64MiB/c8" {
		t.Errorf("String() = %q", c.String())
	}
}
