package capi

import (
	"context"
	"testing"
	"time"
)

func TestZZStartup(t *testing.T) {
	ctx := context.Background()
	l := New()
	cfg := []byte(`{"discover":true,"slabs":true,"cluster_key":"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff","node_pool_bytes":-1}`)
	for i := 0; i < 30; i++ {
		t0 := time.Now()
		h, err := l.NewRuntime(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		d := time.Since(t0)
		if i < 5 || i%10 == 0 {
			t.Logf("start %d: %v", i, d)
		}
		l.Close(ctx, h)
	}
}
