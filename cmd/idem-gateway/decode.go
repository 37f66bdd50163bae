package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// The configuration is decoded by walking YAML's node tree rather than by
// yaml.Unmarshal, so that every error names the file, the line and the
// field's path ("gateway.yaml:12:5: routes[1].lease: ..."), in words that
// speak of the file rather than of Go types; and so that the defaults live
// in one place, the fields' default tags, which the reference prints.
// A field written with no value (nothing after the colon, ~ or null) is
// its default as when it is left out; or, without a default, {} for a
// mapping and an error for anything else: never a zero that would mean
// "off" (protect: alone is not protect: []).

// ConfigError is one error of a configuration file.
type ConfigError struct {
	File   string
	Line   int // 0 when the error is of the file as a whole
	Column int
	Path   string // the field, "routes[1].lease"; "" for the whole file
	Msg    string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Line > 0 && e.Column > 0 {
		fmt.Fprintf(&b, ":%d", e.Column)
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// errConfig is what every configuration error wraps, for errors.Is.
var errConfig = errors.New("invalid configuration")

// ConfigErrors are all the errors found in a configuration file.
type ConfigErrors []*ConfigError

func (es ConfigErrors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func (es ConfigErrors) Unwrap() []error {
	out := make([]error, 0, len(es)+1)
	out = append(out, errConfig)
	for _, e := range es {
		out = append(out, e)
	}
	return out
}

// decoder decodes one file, remembering where each field was.
type decoder struct {
	file string
	errs ConfigErrors
	pos  map[string]*yaml.Node // by path, the node each field was decoded from
	bad  map[string]bool       // the paths that did not decode
}

// parseConfig decodes and validates a configuration file's contents.
func parseConfig(file string, data []byte) (*Config, error) {
	d := &decoder{file: file, pos: map[string]*yaml.Node{}, bad: map[string]bool{}}
	// The file holds one YAML document; empty ones (a lone ---) around it
	// are not counted.
	var root *yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, ConfigErrors{{File: file, Line: yamlLine(err), Msg: yamlMsg(err)}}
		}
		n := &doc
		if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
			n = n.Content[0]
		}
		if n.Kind == 0 || isNull(n) {
			continue
		}
		if root != nil {
			return nil, ConfigErrors{{File: file, Line: doc.Line, Column: doc.Column, Msg: "more than one YAML document"}}
		}
		root = n
	}
	if root == nil {
		return nil, ConfigErrors{{File: file, Msg: "the file holds no configuration"}}
	}
	cfg := new(Config)
	d.value(root, "", reflect.ValueOf(cfg).Elem())
	validate(d, cfg)
	if len(d.errs) > 0 {
		slices.SortStableFunc(d.errs, func(a, b *ConfigError) int {
			return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
		})
		return nil, d.errs
	}
	return cfg, nil
}

// yamlLine and yamlMsg take YAML's own syntax errors apart: "yaml: line
// 3: mapping values are not allowed in this context".
func yamlLine(err error) int {
	s := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(s, "line "); ok {
		if n, _, ok := strings.Cut(rest, ":"); ok {
			if l, err := strconv.Atoi(n); err == nil {
				return l
			}
		}
	}
	return 0
}

func yamlMsg(err error) string {
	s := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(s, "line "); ok {
		if _, msg, ok := strings.Cut(rest, ": "); ok {
			return "not valid YAML: " + msg
		}
	}
	return "not valid YAML: " + s
}

// errorf records an error at path, placed at the node decoded for path or,
// when there is none (a field left out), at its nearest parent.
func (d *decoder) errorf(path, format string, args ...any) {
	if d.failed(path) {
		return // what did not decode is reported already
	}
	e := &ConfigError{File: d.file, Path: path, Msg: fmt.Sprintf(format, args...)}
	for p := path; ; p = parentPath(p) {
		if n, ok := d.pos[p]; ok {
			e.Line, e.Column = n.Line, n.Column
			break
		}
		if p == "" {
			break
		}
	}
	d.errs = append(d.errs, e)
}

// failed reports whether path, or a field that holds it, did not decode.
func (d *decoder) failed(path string) bool {
	for p := path; p != ""; p = parentPath(p) {
		if d.bad[p] {
			return true
		}
	}
	return d.bad[""]
}

// at records an error at node n.
func (d *decoder) at(n *yaml.Node, path, format string, args ...any) {
	d.bad[path] = true
	d.errs = append(d.errs, &ConfigError{File: d.file, Line: n.Line, Column: n.Column, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// parentPath returns the path of the field that holds path's.
func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

var durationType = reflect.TypeFor[time.Duration]()

// maxItems bounds the lists that a time or a memory that grows faster
// than their length would make too long: they are refused before their
// items are decoded.
var maxItems = map[string]struct {
	n         int
	what, why string
}{
	"routes": {maxRoutes, "routes", " (a pattern's {name} wildcards serve many paths with one route)"},
}

// value decodes n into v, a field at path.
func (d *decoder) value(n *yaml.Node, path string, v reflect.Value) {
	d.pos[path] = n
	if n.Kind == yaml.AliasNode {
		d.at(n, path, "aliases are not supported: write the value out")
		return
	}
	if isNull(n) {
		d.empty(n, path, v)
		return
	}
	switch {
	case v.Kind() == reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.value(n, path, v.Elem())
	case v.Kind() == reflect.Struct:
		d.object(n, path, v)
	case v.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.at(n, path, "want a list, got %s", kindName(n))
			return
		}
		if m, ok := maxItems[path]; ok && len(n.Content) > m.n {
			d.at(n, path, "%d %s: at most %d%s", len(n.Content), m.what, m.n, m.why)
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if isNull(c) {
				d.pos[p] = c
				d.at(c, p, "no value: write one, or remove the item")
				continue
			}
			d.value(c, p, s.Index(i))
		}
		v.Set(s)
	case v.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.at(n, path, "want a mapping of names, got %s", kindName(n))
			return
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, c := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			if k.Kind != yaml.ScalarNode || k.Value == "" {
				d.at(k, path, "want a non-empty name")
				continue
			}
			if m.MapIndex(reflect.ValueOf(k.Value)).IsValid() {
				d.at(k, p, "declared twice")
				continue
			}
			e := reflect.New(v.Type().Elem()).Elem()
			d.value(c, p, e)
			m.SetMapIndex(reflect.ValueOf(k.Value), e)
		}
		v.Set(m)
	default:
		if n.Kind != yaml.ScalarNode {
			d.at(n, path, "want a %s, got %s", typeName(v.Type()), kindName(n))
			return
		}
		if err := setScalar(v, n.Value); err != nil {
			d.at(n, path, "%v", err)
		}
	}
}

// object decodes the mapping n into the struct v: unknown and repeated
// fields are errors, and fields left out take their default tag.
func (d *decoder) object(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.at(n, path, "want a mapping of fields, got %s", kindName(n))
		return
	}
	t := v.Type()
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, c := n.Content[i], n.Content[i+1]
		f, ok := fieldNamed(t, k.Value)
		p := join(path, k.Value)
		switch {
		case !ok:
			d.at(k, p, "unknown field (known: %s)", strings.Join(fieldNames(t), ", "))
		case seen[k.Value]:
			d.at(k, p, "declared twice")
		case isNull(c) && hasDefault(f):
			// An empty value is the default, as when the field is left out.
			seen[k.Value] = true
			d.pos[p] = c
			applyDefault(v.FieldByIndex(f.Index), f)
		default:
			seen[k.Value] = true
			d.pos[p] = c
			d.value(c, p, v.FieldByIndex(f.Index))
		}
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if seen[name] {
			continue
		}
		applyDefault(v.Field(i), f)
	}
}

// isNull reports whether n is YAML's null: nothing after the colon, ~ or
// null.
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func hasDefault(f reflect.StructField) bool {
	_, ok := f.Tag.Lookup("default")
	return ok
}

// empty decodes n, the empty value of a field whose tag has no default,
// into v: a mapping's is {}, whose fields take their defaults; anything
// else's is an error, never a zero that would mean "off".
func (d *decoder) empty(n *yaml.Node, path string, v reflect.Value) {
	t := v.Type()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if v.Kind() == reflect.Pointer {
			v.Set(reflect.New(t))
			v = v.Elem()
		}
		for i := range t.NumField() {
			applyDefault(v.Field(i), t.Field(i))
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(t))
	default:
		d.at(n, path, "no value: write one, or leave the field out")
	}
}

// applyDefault sets the field f, left out of the file, to its default tag,
// and the fields of a struct left out to theirs.
func applyDefault(v reflect.Value, f reflect.StructField) {
	if def, ok := f.Tag.Lookup("default"); ok {
		if err := setDefault(v, def); err != nil {
			panic(fmt.Sprintf("idem-gateway: default of %s: %v", f.Name, err))
		}
		return
	}
	if v.Kind() == reflect.Struct {
		for i := range v.NumField() {
			applyDefault(v.Field(i), v.Type().Field(i))
		}
	}
}

// setDefault sets v from a default tag: a scalar or a YAML flow list.
func setDefault(v reflect.Value, def string) error {
	if v.Kind() == reflect.Slice {
		items, err := defaultList(def)
		if err != nil {
			return err
		}
		s := reflect.MakeSlice(v.Type(), len(items), len(items))
		for i, it := range items {
			if err := setScalar(s.Index(i), it); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	}
	return setScalar(v, def)
}

// defaultLists holds the default tags' lists, parsed once: a file of many
// routes does not parse a route's default again for each.
var defaultLists sync.Map // tag -> []string

func defaultList(def string) ([]string, error) {
	if items, ok := defaultLists.Load(def); ok {
		return items.([]string), nil
	}
	var items []string
	if err := yaml.Unmarshal([]byte(def), &items); err != nil {
		return nil, err
	}
	defaultLists.Store(def, items)
	return items, nil
}

// setScalar sets v, a string, bool, integer or duration, from s.
func setScalar(v reflect.Value, s string) error {
	if v.Type() == durationType {
		dur, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not a duration (write it as 500ms, 30s, 5m or 24h)", s)
		}
		v.SetInt(int64(dur))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil || (s != "true" && s != "false") {
			return fmt.Errorf("%q is not true or false", s)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v.OverflowInt(i) {
			return fmt.Errorf("%q is not an integer", s)
		}
		v.SetInt(i)
	default:
		panic("idem-gateway: no scalar decoding for " + v.Type().String())
	}
	return nil
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

func fieldNamed(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if f := t.Field(i); yamlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func fieldNames(t reflect.Type) []string {
	names := make([]string, t.NumField())
	for i := range names {
		names[i] = yamlName(t.Field(i))
	}
	return names
}

// kindName names what a node holds, for errors.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "something else"
}

// typeName names a Go type in the file's words.
func typeName(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		return "integer"
	}
	return "string"
}
