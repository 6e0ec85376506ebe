// Package schema is the one definition of a runtime's configuration: every
// field once, with its name, type, default, documentation, environment
// variable and the layers that expose it (Go's rdt.Config, the C ABI's and
// Python's JSON config, the worker's Config and its command's flags).
//
// Each layer spells a field's name the same way: snake_case in JSON and
// Python (Name), CamelCase in Go (GoName), kebab-case in flags (Flag). The
// C ABI's and the worker's Config structs, the Python TypedDict
// (python/tensorlane/_config.py), the C header's key list and the table in
// docs/config.md are generated from it (rdt/internal/confgen, `go generate
// ./rdt/schema`); rdt.Config, which also holds live Go objects, is checked
// against it by a test. Old names stay accepted as deprecated aliases that log a
// warning once per process (Alias).
//
// Decode is the C ABI's (and so Python's) strict JSON reader: an unknown key
// is a FieldError that suggests the nearest field, an alias is rewritten to
// its field, and a value of the wrong type names its field.
package schema

//go:generate go run ../internal/confgen -root ../..

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Layer is a set of layers that expose a field.
type Layer uint8

const (
	// Go is rdt.Config.
	Go Layer = 1 << iota
	// JSON is the C ABI's JSON config (capi.Config), which Python passes
	// as a dict (tensorlane.Config).
	JSON
	// Worker is worker.Config and the flags of `tensorlane worker`.
	Worker
)

// String lists the layers as the docs table does.
func (l Layer) String() string {
	var out []string
	for _, x := range []struct {
		l    Layer
		name string
	}{{Go, "go"}, {JSON, "json"}, {Worker, "worker"}} {
		if l&x.l != 0 {
			out = append(out, x.name)
		}
	}
	return strings.Join(out, ",")
}

// Type is a field's value type, the same at every layer as far as the
// layer's language allows.
type Type string

const (
	String   Type = "string"
	Bool     Type = "bool"
	Int      Type = "int"
	Strings  Type = "[]string"
	Ints     Type = "[]int"
	ByteSize Type = "bytes"    // a byte count: Go int64; JSON a number or "64MiB"; flags "64MiB"
	Duration Type = "duration" // Go time.Duration; JSON seconds (a number) or "1.5s"; flags "1.5s"
	HexKey   Type = "key"      // 32 bytes: Go []byte; JSON and env 64 hex digits
	OptBool  Type = "bool?"    // unset means the environment's (Go *bool)
)

// Alias is an old name of a field, still accepted with a warning (once per
// process and name).
type Alias struct {
	// Name is the old JSON key (JSON) or flag (Worker).
	Name  string
	Layer Layer
	// Millis: the old JSON value was a number of milliseconds
	// (transfer_timeout_ms), converted to the field's seconds.
	Millis bool
}

// Field is one configuration field.
type Field struct {
	// Name is the field's snake_case name (JSON key, Python key); GoName
	// and Flag derive from it.
	Name string
	Type Type
	// Default is the documented default, as people read it ("" when the
	// zero value means nothing is set). WorkerDefault is the worker's own
	// where it differs (it simulates a small cluster).
	Default, WorkerDefault string
	Doc                    string
	// Env is the environment variable that sets the field when the config
	// does not (unless the runtime ignores the environment).
	Env     string
	Layers  Layer
	Aliases []Alias
	// Negative: a negative byte count means something (off), so it is
	// not refused.
	Negative bool
}

// initialisms are the words Go spells in capitals.
var initialisms = map[string]string{"rdma": "RDMA", "ip": "IP", "id": "ID", "ms": "MS"}

// GoName is the field's name in rdt.Config and worker.Config.
func (f Field) GoName() string {
	var b strings.Builder
	for w := range strings.SplitSeq(f.Name, "_") {
		if s, ok := initialisms[w]; ok {
			b.WriteString(s)
			continue
		}
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

// Flag is the field's flag name (without the dashes).
func (f Field) Flag() string { return strings.ReplaceAll(f.Name, "_", "-") }

// DefaultText is the default as the docs table shows it: the worker's
// own, where it differs, in parentheses.
func (f Field) DefaultText() string {
	if f.WorkerDefault == "" {
		return f.Default
	}
	return f.Default + " (worker: " + f.WorkerDefault + ")"
}

// In reports whether layer l exposes the field.
func (f Field) In(l Layer) bool { return f.Layers&l != 0 }

// Fields returns the table, in documentation order (a copy).
func Fields() []Field {
	out := make([]Field, len(fields))
	copy(out, fields)
	return out
}

// Lookup returns the field named name (its snake_case name).
func Lookup(name string) (Field, bool) {
	for _, f := range fields {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

// Of returns the fields layer l exposes, in table order.
func Of(l Layer) []Field {
	var out []Field
	for _, f := range fields {
		if f.In(l) {
			out = append(out, f)
		}
	}
	return out
}

// GoOnly are rdt.Config's fields that hold live Go objects or hooks, so no
// other layer can carry them; every other field of rdt.Config is in the
// table (a test checks).
var GoOnly = []string{"Cluster", "Identity", "Devices", "Transports", "Clock", "Logger", "Registerer"}

// DefaultDuration is the default of the Duration field name, parsed, so
// that code applying defaults reads the one definition in the table. It
// panics on a name that is not a Duration field with a plain default: a
// programming error the schema's tests catch for every such field.
func DefaultDuration(name string) time.Duration {
	f, ok := Lookup(name)
	d, err := time.ParseDuration(f.Default)
	if !ok || f.Type != Duration || err != nil {
		panic(fmt.Sprintf("schema: %q has no duration default", name))
	}
	return d
}

// DefaultInt is DefaultDuration for an Int field.
func DefaultInt(name string) int {
	f, ok := Lookup(name)
	n, err := strconv.Atoi(f.Default)
	if !ok || f.Type != Int || err != nil {
		panic(fmt.Sprintf("schema: %q has no integer default", name))
	}
	return n
}
