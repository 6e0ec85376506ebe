package harness

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new") // created on the way
	recs := []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 0.6), rec("p2p", 4<<20, 1, BaseMemcpy, 0.7)}
	files, err := WriteReport(dir, File{Version: FileVersion, Records: recs}, recs)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 3, "results, report and a plot: %v", files)
	assert.Equal(t, filepath.Join(dir, "results.json"), files[0])
	assert.Equal(t, filepath.Join(dir, "report.md"), files[1])
	for _, f := range files {
		st, err := os.Stat(f)
		require.NoError(t, err)
		assert.Positive(t, st.Size(), f)
	}
	md, err := os.ReadFile(files[1])
	require.NoError(t, err)
	assert.Contains(t, string(md), "("+filepath.Base(files[2])+")", "report.md links its plots beside it")
	back, err := ReadFile(files[0])
	require.NoError(t, err)
	assert.Len(t, back.Records, 2)
}
