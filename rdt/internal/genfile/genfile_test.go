package genfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRegenerateReportsAndWritesStaleFiles(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "same.txt"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "old.txt"), []byte("old"), 0o644))
	var firstOld []byte = []byte("unset")
	files := []File{
		{"same.txt", func([]byte) ([]byte, error) { return []byte("x"), nil }},
		{"old.txt", func([]byte) ([]byte, error) { return []byte("new"), nil }},
		{"missing.txt", func(old []byte) ([]byte, error) {
			if string(firstOld) == "unset" {
				firstOld = old
			}
			return []byte("made"), nil
		}},
	}
	stale, err := Regenerate(root, false, files)
	require.NoError(t, err)
	assert.Equal(t, []string{"old.txt", "missing.txt"}, stale)
	assert.Nil(t, firstOld, "a missing file is generated from nil")
	b, _ := os.ReadFile(filepath.Join(root, "old.txt"))
	assert.Equal(t, "old", string(b), "not written without write")

	stale, err = Regenerate(root, true, files)
	require.NoError(t, err)
	assert.Len(t, stale, 2)
	stale, err = Regenerate(root, false, files)
	require.NoError(t, err)
	assert.Empty(t, stale, "written, so current")
}

func TestSplice(t *testing.T) {
	for _, tc := range []struct {
		name, old, want, err string
	}{
		{"replaces the block", "a\n/*B*/\nold\n/*E*/\nz\n", "a\n/*B*/\nnew\n/*E*/\nz\n", ""},
		{"empty block", "/*B*/\n/*E*/", "/*B*/\nnew\n/*E*/", ""},
		{"no markers", "a\n", "", "not found"},
		{"end before begin", "/*E*/\n/*B*/\n", "", "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Splice([]byte(tc.old), "/*B*/", "/*E*/", "new\n")
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}
