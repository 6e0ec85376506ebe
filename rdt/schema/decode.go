package schema

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Conditions a FieldError stands for.
var (
	// ErrUnknownField: the key is no field of the layer (nor an alias).
	ErrUnknownField = errors.New("unknown field")
	// ErrBadValue: the value does not fit the field.
	ErrBadValue = errors.New("bad value")
	// ErrConflict: a field was given twice, by its name and an alias.
	ErrConflict = errors.New("given twice")
)

// FieldError is a configuration field that could not be used. It wraps one
// of ErrUnknownField, ErrBadValue and ErrConflict, and the cause.
type FieldError struct {
	Field   string // the key as given
	Suggest string // for an unknown field, the nearest known name ("" if none is near)
	Err     error
}

func (e *FieldError) Error() string {
	s := fmt.Sprintf("config field %q: %v", e.Field, e.Err)
	if e.Suggest != "" {
		s += fmt.Sprintf(" (did you mean %q?)", e.Suggest)
	}
	return s
}

func (e *FieldError) Unwrap() error { return e.Err }

// Bad returns a FieldError for a value of field name that does not fit.
func Bad(name, format string, args ...any) error {
	return &FieldError{Field: name, Err: fmt.Errorf("%w: "+format, append([]any{ErrBadValue}, args...)...)}
}

// Decode reads a JSON object of layer l's fields into dst (a pointer to a
// struct whose json tags are the fields' names). Empty input leaves dst as
// it is. An unknown key fails with a FieldError suggesting the nearest
// field; an alias is read as its field, with a warning on log (default
// slog.Default()) once per process and alias.
func Decode(p []byte, l Layer, dst any, log *slog.Logger) error {
	if len(bytes.TrimSpace(p)) == 0 {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(p, &raw); err != nil {
		return fmt.Errorf("config: want a JSON object: %w", err)
	}
	out := make(map[string]json.RawMessage, len(raw))
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	slices.Sort(keys) // errors in a stable order
	for _, k := range keys {
		v := raw[k]
		name, a, err := resolve(k, l)
		if err != nil {
			return err
		}
		if a != nil {
			if _, dup := raw[name]; dup {
				return &FieldError{Field: k, Err: fmt.Errorf("%w: %q is the old name of %q, which is set too", ErrConflict, k, name)}
			}
			Deprecated(log, k, name)
			if a.Millis {
				if v, err = millisToSeconds(v); err != nil {
					return &FieldError{Field: k, Err: fmt.Errorf("%w: %v", ErrBadValue, err)}
				}
			}
		}
		out[name] = v
	}
	for name, v := range out {
		f, _ := Lookup(name)
		if err := checkValue(f, v); err != nil {
			return err
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields() // a struct that lacks a field of the table is a bug: say so
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		var fe *FieldError
		switch {
		case errors.As(err, &fe):
			return fe
		case errors.As(err, &te):
			return &FieldError{Field: te.Field, Err: fmt.Errorf("%w: want %s, got JSON %s", ErrBadValue, typeOf(te.Field), te.Value)}
		}
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// typeOf names a field's type for an error.
func typeOf(name string) Type {
	f, _ := Lookup(name)
	return f.Type
}

// checkValue refuses a JSON value of the wrong shape early, with the field's
// name: the decoder's own messages name Go types.
func checkValue(f Field, v json.RawMessage) error {
	var x any
	if err := json.Unmarshal(v, &x); err != nil {
		return &FieldError{Field: f.Name, Err: fmt.Errorf("%w: %v", ErrBadValue, err)}
	}
	if x == nil {
		return nil // null: the default
	}
	ok := true
	switch f.Type {
	case String, HexKey:
		_, ok = x.(string)
	case Bool, OptBool:
		_, ok = x.(bool)
	case Int:
		n, isNum := x.(float64)
		ok = isNum && n == math.Trunc(n)
	case Strings:
		xs, isList := x.([]any)
		ok = isList
		for _, e := range xs {
			if _, s := e.(string); !s {
				ok = false
			}
		}
	case Ints:
		xs, isList := x.([]any)
		ok = isList
		for _, e := range xs {
			if n, num := e.(float64); !num || n != math.Trunc(n) || n < 0 {
				ok = false
			}
		}
	case ByteSize:
		var n float64
		switch y := x.(type) {
		case string:
			m, err := ParseSize(y)
			ok, n = err == nil, float64(m)
		case float64:
			n = y
			ok = n == math.Trunc(n)
		default:
			ok = false
		}
		if ok && n < 0 && !f.Negative {
			return Bad(f.Name, "must not be negative, got %s", v)
		}
	case Duration:
		var d time.Duration
		switch y := x.(type) {
		case string:
			var err error
			d, err = time.ParseDuration(strings.TrimSpace(y))
			ok = err == nil
		case float64:
			d = time.Duration(y * float64(time.Second))
		default:
			ok = false
		}
		if ok && d < 0 {
			return Bad(f.Name, "must not be negative, got %s", v)
		}
	}
	if !ok {
		return &FieldError{Field: f.Name, Err: fmt.Errorf("%w: want %s, got %s", ErrBadValue, describe(f.Type), v)}
	}
	if f.Type == HexKey {
		if _, err := ParseKey(x.(string)); err != nil {
			return Bad(f.Name, "%v", err)
		}
	}
	return nil
}

// ParseKey reads a cluster key: 64 hex digits.
func ParseKey(s string) ([]byte, error) {
	k, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(k) != 32 {
		return nil, errors.New("a cluster key is 64 hex digits (32 bytes)")
	}
	return k, nil
}

func describe(t Type) string {
	switch t {
	case ByteSize:
		return "a byte count (a number or a string like \"64MiB\")"
	case Duration:
		return "a duration (seconds as a number, or a string like \"1.5s\")"
	case HexKey:
		return "64 hex digits"
	case Strings:
		return "a list of strings"
	case Ints:
		return "a list of non-negative integers"
	case OptBool:
		return "true, false or null"
	case Int:
		return "an integer"
	}
	return "a " + string(t)
}

// resolve maps a key of layer l to its field's name, with the alias it
// was given by (nil when the name is the field's own).
func resolve(key string, l Layer) (string, *Alias, error) {
	for i := range fields {
		f := &fields[i]
		if !f.In(l) {
			continue
		}
		if f.Name == key {
			return key, nil, nil
		}
		for j := range f.Aliases {
			if a := &f.Aliases[j]; a.Name == key && a.Layer&l != 0 {
				return f.Name, a, nil
			}
		}
	}
	if f, ok := Lookup(key); ok { // a field, but of other layers: say where
		return "", nil, &FieldError{Field: key, Suggest: Suggest(key, l), Err: fmt.Errorf("%w: it is a setting of %s only", ErrUnknownField, f.Layers)}
	}
	return "", nil, &FieldError{Field: key, Suggest: Suggest(key, l), Err: ErrUnknownField}
}

// Suggest returns the field of layer l that key most likely meant, or "":
// the field key names in another spelling (ClusterKey, cluster-key), else
// the first field whose name contains key (stall: stall_timeout), else the
// nearest by edit distance, at most a third of key's length away.
func Suggest(key string, l Layer) string {
	norm := normalize(key)
	best, bestD := "", len(norm)/3+1
	for _, f := range Of(l) {
		if f.Name == norm {
			return f.Name
		}
	}
	for _, f := range Of(l) {
		if len(norm) > 2 && strings.Contains(f.Name, norm) {
			return f.Name
		}
	}
	for _, f := range Of(l) {
		if d := distance(norm, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	}
	return best
}

// normalize spells key as a field name: ClusterKey, clusterKey and
// cluster-key become cluster_key.
func normalize(key string) string {
	var b strings.Builder
	for i, r := range key {
		switch {
		case r == '-' || r == ' ':
			b.WriteByte('_')
		case r >= 'A' && r <= 'Z':
			if i > 0 && key[i-1] != '_' && key[i-1] != '-' && !(key[i-1] >= 'A' && key[i-1] <= 'Z') {
				b.WriteByte('_')
			}
			b.WriteRune(r + 'a' - 'A')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var warned sync.Map // alias -> struct{}

// Deprecated logs, once per process, that old is an old name of field.
func Deprecated(log *slog.Logger, old, field string) {
	if _, done := warned.LoadOrStore(old, struct{}{}); done {
		return
	}
	if log == nil {
		log = slog.Default()
	}
	log.Warn("tensorlane config: a deprecated name was used; it still works, but use the new one (docs/config.md)", "old", old, "new", field)
}

func millisToSeconds(v json.RawMessage) (json.RawMessage, error) {
	var ms float64
	if err := json.Unmarshal(v, &ms); err != nil {
		return nil, fmt.Errorf("want milliseconds as a number, got %s", v)
	}
	return json.RawMessage(strconv.FormatFloat(ms/1000, 'g', -1, 64)), nil
}

// Size is a byte count in JSON: a number, or a string with an optional
// unit (K, M, G, T with or without iB: binary multiples; KB, MB, GB, TB:
// decimal).
type Size int64

// UnmarshalJSON reads a number or a size string.
func (s *Size) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var str string
	if json.Unmarshal(b, &str) == nil {
		n, err := ParseSize(str)
		if err != nil {
			return err
		}
		*s = Size(n)
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil || n != math.Trunc(n) {
		return fmt.Errorf("want a byte count, got %s", b)
	}
	*s = Size(n)
	return nil
}

// ParseSize reads "4096", "-1", "64MiB", "64M", "1.5GiB", "1GB".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToUpper(strings.TrimSpace(t[i:]))
	mult := map[string]float64{"": 1, "B": 1,
		"K": 1 << 10, "KI": 1 << 10, "KIB": 1 << 10, "KB": 1e3,
		"M": 1 << 20, "MI": 1 << 20, "MIB": 1 << 20, "MB": 1e6,
		"G": 1 << 30, "GI": 1 << 30, "GIB": 1 << 30, "GB": 1e9,
		"T": 1 << 40, "TI": 1 << 40, "TIB": 1 << 40, "TB": 1e12}[unit]
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 0 || math.Abs(n*mult) > 1<<62 {
		return 0, fmt.Errorf("bad size %q (use e.g. 64MiB)", s)
	}
	return int64(n * mult), nil
}

// Seconds is a duration in JSON: a number of seconds or a Go duration
// string ("1.5s", "2m").
type Seconds time.Duration

// UnmarshalJSON reads a number of seconds or a duration string.
func (d *Seconds) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var str string
	if json.Unmarshal(b, &str) == nil {
		v, err := time.ParseDuration(strings.TrimSpace(str))
		if err != nil {
			return err
		}
		*d = Seconds(v)
		return nil
	}
	var s float64
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want seconds or a duration string, got %s", b)
	}
	*d = Seconds(time.Duration(s * float64(time.Second)))
	return nil
}

// MarshalJSON writes seconds as a number.
func (d Seconds) MarshalJSON() ([]byte, error) {
	return []byte(strconv.FormatFloat(time.Duration(d).Seconds(), 'g', -1, 64)), nil
}
