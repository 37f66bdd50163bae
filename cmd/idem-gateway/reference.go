package main

import (
	"fmt"
	"reflect"
	"strings"
)

// configReference returns the Markdown table of every configuration
// field: its path, type, default and meaning, from the Config type's
// tags. docs/gateway.md holds it (a test keeps the two the same).
func configReference() string {
	var b strings.Builder
	b.WriteString("| field | type | default | meaning |\n|---|---|---|---|\n")
	referenceOf(&b, reflect.TypeFor[Config](), "")
	return b.String()
}

func referenceOf(b *strings.Builder, t reflect.Type, prefix string) {
	for i := range t.NumField() {
		f := t.Field(i)
		path := prefix + yamlName(f)
		ft := f.Type
		kind := ""
		switch {
		case ft.Kind() == reflect.Map:
			path += ".NAME"
			ft = ft.Elem()
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.String:
			path += "[]"
			ft = ft.Elem()
		case ft.Kind() == reflect.Slice:
			kind = "list of strings"
		}
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if kind == "" {
			kind = typeName(ft)
			if ft.Kind() == reflect.Struct {
				kind = "mapping"
			}
		}
		def := "—"
		if d, ok := f.Tag.Lookup("default"); ok {
			def = "`" + d + "`"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", path, kind, def, strings.ReplaceAll(f.Tag.Get("doc"), "|", "\\|"))
		if ft.Kind() == reflect.Struct && ft != durationType {
			referenceOf(b, ft, path+".")
		}
	}
}
