package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSoakCommandJSON(t *testing.T) {
	out, err := execCmd(t, newSoakCmd(), "--duration", "1s", "--json", "--seed", "7", "--max-size", "256KiB")
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	for _, k := range []string{"transfers", "faults_injected", "errors_surfaced", "hung", "bytes_corrupted", "leaked_bytes"} {
		assert.Contains(t, got, k)
	}
	assert.Equal(t, 0.0, got["hung"])
}

// TestSoakBadFlags: flags the engine cannot run with fail before anything
// starts; a zero is refused, not read as the engine's default.
func TestSoakBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--runtimes", "1"},
		{"--concurrency", "0"},
		{"--max-size", "huge"},
		{"--duration", "0s"},
		{"--max-size", "4"}, // less than a word: refused, not the default (and no panic)
	} {
		_, err := execCmd(t, newSoakCmd(), args...)
		assert.Error(t, err, "%v", args)
	}
}
