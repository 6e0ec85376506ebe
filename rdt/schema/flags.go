package schema

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// BindFlags registers a flag for every field of layer l on fs, writing into
// the struct dst points to (its fields named by GoName), with the field's
// doc and default as help. Each flag's own default is the zero value, so
// the layer's defaults apply unless a flag is given. Aliases of layer l
// become hidden flags that set the same field and log a warning once
// (Deprecated, on slog's default logger: stderr, never a command's output,
// which may be a protocol). short maps a field's name to a one-letter
// shorthand.
func BindFlags(fs *pflag.FlagSet, dst any, l Layer, short map[string]string) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("schema: BindFlags wants a pointer to a struct, got %T", dst)
	}
	s := v.Elem()
	for _, f := range Of(l) {
		fv := s.FieldByName(f.GoName())
		if !fv.IsValid() {
			return fmt.Errorf("schema: %s has no field %s (%s)", s.Type(), f.GoName(), f.Name)
		}
		val, err := flagValue(f, fv)
		if err != nil {
			return err
		}
		fs.VarP(val, f.Flag(), short[f.Name], help(f))
		if f.Type == Bool {
			fs.Lookup(f.Flag()).NoOptDefVal = "true"
		}
		for _, a := range f.Aliases {
			if a.Layer&l == 0 {
				continue
			}
			fs.Var(&aliasValue{Value: val, old: "--" + a.Name, new: "--" + f.Flag()}, a.Name, help(f))
			if f.Type == Bool {
				fs.Lookup(a.Name).NoOptDefVal = "true"
			}
			if err := fs.MarkHidden(a.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// help is a flag's usage line: the field's doc, default and variable
// (no backquotes: pflag reads a quoted word as the value's name).
func help(f Field) string {
	h := strings.ReplaceAll(strings.TrimSuffix(f.Doc, "."), "`", "")
	var notes []string
	switch {
	case f.WorkerDefault != "":
		notes = append(notes, "default "+f.WorkerDefault)
	case f.Default != "":
		notes = append(notes, "default "+f.Default)
	}
	if f.Env != "" {
		notes = append(notes, "env "+f.Env)
	}
	if len(notes) > 0 {
		h += " (" + strings.Join(notes, "; ") + ")"
	}
	return h
}

// flagValue is the pflag.Value of field f, stored in fv.
func flagValue(f Field, fv reflect.Value) (pflag.Value, error) {
	p := fv.Addr().Interface()
	var val pflag.Value
	switch f.Type {
	case String:
		if q, ok := p.(*string); ok {
			val = (*stringValue)(q)
		}
	case Bool:
		if q, ok := p.(*bool); ok {
			val = (*boolValue)(q)
		}
	case Int:
		if q, ok := p.(*int); ok {
			val = (*intValue)(q)
		}
	case Strings:
		if q, ok := p.(*[]string); ok {
			val = &stringsValue{p: q}
		}
	case ByteSize:
		if q, ok := p.(*int64); ok {
			val = &sizeValue{p: q, negative: f.Negative}
		}
	case Duration:
		if q, ok := p.(*time.Duration); ok {
			val = (*durationValue)(q)
		}
	}
	if val == nil {
		return nil, fmt.Errorf("schema: field %s (%s) is %s, which does not hold a flag of type %s", f.GoName(), f.Name, fv.Type(), f.Type)
	}
	return val, nil
}

// aliasValue is an old flag: it sets its field and warns once.
type aliasValue struct {
	pflag.Value
	old, new string
}

func (a *aliasValue) Set(v string) error {
	Deprecated(nil, a.old, a.new)
	return a.Value.Set(v)
}

type stringValue string

func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) String() string     { return string(*s) }
func (s *stringValue) Type() string       { return "string" }

type boolValue bool

func (b *boolValue) Set(v string) error {
	x, err := strconv.ParseBool(v)
	*b = boolValue(x)
	return err
}
func (b *boolValue) String() string { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) Type() string   { return "bool" }

type intValue int

func (n *intValue) Set(v string) error {
	x, err := strconv.Atoi(v)
	*n = intValue(x)
	return err
}
func (n *intValue) String() string { return strconv.Itoa(int(*n)) }
func (n *intValue) Type() string   { return "int" }

// stringsValue is a comma-separated list; the first Set replaces the
// default, later ones append (as pflag's string slices do).
type stringsValue struct {
	p   *[]string
	set bool
}

func (s *stringsValue) Set(v string) error {
	var xs []string
	for x := range strings.SplitSeq(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			xs = append(xs, x)
		}
	}
	if !s.set {
		*s.p, s.set = xs, true
	} else {
		*s.p = append(*s.p, xs...)
	}
	return nil
}
func (s *stringsValue) String() string {
	if len(*s.p) == 0 {
		return "" // pflag shows no default of its own for ""
	}
	return "[" + strings.Join(*s.p, ",") + "]"
}
func (s *stringsValue) Type() string { return "strings" }

type sizeValue struct {
	p        *int64
	negative bool
}

func (s *sizeValue) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	if n < 0 && !s.negative {
		return fmt.Errorf("bad size %q: must not be negative", v)
	}
	*s.p = n
	return nil
}
func (s *sizeValue) String() string { return strconv.FormatInt(*s.p, 10) }
func (s *sizeValue) Type() string   { return "size" }

type durationValue time.Duration

func (d *durationValue) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err == nil && x < 0 {
		err = fmt.Errorf("must not be negative")
	}
	*d = durationValue(x)
	return err
}
func (d *durationValue) String() string {
	if *d == 0 {
		return ""
	}
	return time.Duration(*d).String()
}
func (d *durationValue) Type() string { return "duration" }
