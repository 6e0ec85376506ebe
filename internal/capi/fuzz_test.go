package capi

import (
	"context"
	"testing"
)

// The JSON config and ref bytes come from foreign callers: no input may
// panic, and every refusal is a typed kind.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"preset":"dgx-h100","hosts":2,"host":"h1","allow":["tcp"]}`))
	f.Add([]byte(`{"cluster_key":"00"}`))
	f.Add([]byte(`{"transfer_timeout_ms":-1,"log_level":"loud"}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		c, err := ParseConfig(p)
		if err != nil {
			if Kinds[Code(err)] != "invalid_argument" {
				t.Fatalf("config error of kind %s: %v", Kinds[Code(err)], err)
			}
			return
		}
		if c.Discover {
			return // reads this machine's sysfs: not what this fuzzes
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
