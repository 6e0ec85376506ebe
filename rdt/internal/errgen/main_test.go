package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
)

const root = "../../.."

// The C header's enum and Python's table are what rdt.Kinds says now.
func TestGeneratedTablesAreCurrent(t *testing.T) {
	stale, err := run(root, false)
	require.NoError(t, err)
	assert.Empty(t, stale, "run go generate ./rdt")
}

// Codes are dense and unique; names are unique.
func TestKindsTable(t *testing.T) {
	names := map[string]bool{}
	for i, k := range rdt.Kinds() {
		assert.Equal(t, i+1, k.Code, "codes are dense from 1 (%s)", k.Name)
		assert.False(t, names[k.Name], "kind %s twice", k.Name)
		names[k.Name] = true
		assert.NotEmpty(t, k.Doc, k.Name)
	}
}

// Python has one exception class per kind.
func TestPythonHasAClassPerKind(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(root, "python/tensorlane/errors.py"))
	require.NoError(t, err)
	for _, k := range rdt.Kinds() {
		assert.Regexp(t, regexp.MustCompile(`(?m)^    kind = "`+k.Name+`"$`), string(src), "python/tensorlane/errors.py has no class for %s", k.Name)
	}
}
