package worker

import (
	"reflect"
	"slices"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/schema"
)

// Config holds exactly the schema's worker fields, by their Go names, in
// types the flags can fill (BindFlags checks each type).
func TestConfigMatchesSchema(t *testing.T) {
	var have, want []string
	for f := range reflect.TypeFor[Config]().Fields() {
		have = append(have, f.Name)
	}
	for _, f := range schema.Of(schema.Worker) {
		want = append(want, f.GoName())
	}
	slices.Sort(have)
	slices.Sort(want)
	assert.Equal(t, want, have)
	var c Config
	require.NoError(t, schema.BindFlags(pflag.NewFlagSet("worker", pflag.ContinueOnError), &c, schema.Worker, nil))
}
