package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The engine's own tests are in cmd/internal/demo; these check what the
// command prints.

func TestDemoJSON(t *testing.T) {
	var out bytes.Buffer
	err := runDemo(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 2, readers: 2, tensors: 1, steps: 1, size: "64KiB", json: true})
	require.NoError(t, err)
	var res map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &res))
	for _, k := range []string{"ok", "simulated", "preset", "hosts", "memcpy_gbps", "transfers"} {
		assert.Contains(t, res, k)
	}
	assert.Equal(t, true, res["ok"])
}

// writes records each Write, to see rows leave as they complete.
type writes struct{ calls []string }

func (w *writes) Write(p []byte) (int, error) {
	w.calls = append(w.calls, string(p))
	return len(p), nil
}

func TestDemoTable(t *testing.T) {
	var w writes
	require.NoError(t, runDemo(context.Background(), &w, demoOptions{preset: "dgx-h100", hosts: 2, readers: 2, tensors: 2, steps: 1, size: "64KiB"}))
	out := strings.Join(w.calls, "")
	t.Log("\n" + out)
	assert.Contains(t, out, "verified")
	assert.Contains(t, out, "simulated")
	assert.Contains(t, out, "vs memcpy")
	assert.Regexp(t, `baseline: memcpy .* [0-9.]+ GB/s`, out)
	rows := 0
	for _, c := range w.calls {
		if strings.Contains(c, "reader-") {
			rows++
			assert.Equal(t, 1, strings.Count(c, "\n"), "one row per write, as it completes: %q", c)
			assert.Contains(t, c, "128 KiB", "bytes in human units")
			assert.Regexp(t, `[0-9.]+x  true`, c, "a ratio to the baseline")
		}
	}
	assert.Equal(t, 2, rows)
}

func TestDemoBroadcastTable(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runDemoBroadcast(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 2, readers: 2, tensors: 1, steps: 1, size: "64KiB"}))
	assert.Contains(t, out.String(), "broadcast tree")
	assert.Contains(t, out.String(), "bytes/reader")
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 3 << 19: "1.5 MiB", 512 << 20: "512 MiB", 1 << 30: "1 GiB"} {
		assert.Equal(t, want, humanBytes(n))
	}
}

func TestDemoBadFlags(t *testing.T) {
	var out bytes.Buffer
	for _, o := range []demoOptions{
		{preset: "nope", hosts: 1, readers: 1, tensors: 1, steps: 1, size: "1MiB"},
		{preset: "dgx-h100", hosts: 1, readers: 1, tensors: 1, steps: 1, size: "lots"},
		{preset: "dgx-h100", hosts: 0, readers: 1, tensors: 1, steps: 1, size: "1MiB"},
		{preset: "", hosts: 1, readers: 1, tensors: 1, steps: 1, size: "1MiB"},      // not read as the default preset
		{preset: "dgx-h100", hosts: 1, readers: 1, tensors: 1, steps: 1, size: "4"}, // rounds to no 8-byte word
	} {
		assert.Error(t, runDemo(context.Background(), &out, o), "%+v", o)
		assert.Error(t, runDemoBroadcast(context.Background(), &out, o), "%+v", o)
	}
}
