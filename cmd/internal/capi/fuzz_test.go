package capi

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The JSON config and ref bytes come from foreign callers: no input may
// panic, and every refusal is a typed kind.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"preset":"dgx-h100","hosts":2,"host":"h1","allow":["tcp"]}`))
	f.Add([]byte(`{"cluster_key":"00"}`))
	f.Add([]byte(`{"transfer_timeout_ms":-1,"log_level":"loud"}`))
	f.Add([]byte(`{"stall_timeout":"1s","heartbeat_interval":0.5,"encrypt_data":true,"device_backend":"sim","host_memory":"1MiB"}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		c, err := ParseConfig(p)
		if err != nil {
			if Kinds[Code(err)] != "invalid_argument" {
				t.Fatalf("config error of kind %s: %v", Kinds[Code(err)], err)
			}
			return
		}
		if c.Discover || c.IdentityFile != "" || c.PoolBytes > 1<<30 {
			return // reads this machine's sysfs, writes a key file, holds a lot of memory: not what this fuzzes
		}
		c.rdtConfig(context.Background())
	})
}

func FuzzDescribeRef(f *testing.F) {
	f.Add([]byte("TR\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		if _, err := DescribeRef(p); err != nil && Kinds[Code(err)] != "malformed_ref" && Kinds[Code(err)] != "invalid_argument" {
			t.Fatalf("ref error of kind %s: %v", Kinds[Code(err)], err)
		}
	})
}

// FuzzRefCalls feeds arbitrary ref bytes to every Runtime call that takes
// a ref (issue 29): each returns a typed kind, never panics, and a refused
// read leaves nothing allocated.
func FuzzRefCalls(f *testing.F) {
	_, a, b := pair(f, `{"allow":["shm","tcp"],"transfer_timeout_ms":2000}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(64), DType: "float32", Shape: []int64{4, 4}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ref)
	f.Add(forge(f, ref, 1<<28))
	f.Add(forge(f, ref))
	f.Add(ref[:len(ref)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		typed := func(what string, err error) {
			if err != nil && Kinds[Code(err)] == "other" {
				t.Fatalf("%s: an error of no kind: %v", what, err)
			}
		}
		used := b.Stats().HostMemory.Used
		ptr, _, _, err := b.Get(ctx, p, 0, 2*time.Second)
		if err == nil {
			require.NoError(t, b.FreeMemory(ptr))
		}
		typed("Get", err)
		assert.Equal(t, used, b.Stats().HostMemory.Used, "Get left memory allocated")
		_, err = b.GetInto(ctx, p, make([]byte, 64), 0, 2*time.Second)
		typed("GetInto", err)
		h, _, _, _, err := b.View(ctx, p, ViewConfig{}, 0, 2*time.Second)
		if err == nil {
			require.NoError(t, b.ReleaseView(h))
		}
		typed("View", err)
		if err = b.Hold(ctx, p, 2*time.Second); err == nil {
			require.NoError(t, b.Release(ctx, p))
		}
		typed("Hold", err)
		_, err = b.Explain(p)
		typed("Explain", err)
		_, err = a.Explain(p)
		typed("Explain (owner)", err)
		_, err = DescribeRef(p)
		typed("DescribeRef", err)
	})
}
