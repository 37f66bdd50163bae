package idem

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"abc", "abc", nil},
		{`"abc"`, "abc", nil},
		{`"a\"b\\c"`, `a"b\c`, nil},
		{"with space", "with space", nil},
		{`"with space"`, "with space", nil},
		{"{tag}:*", "{tag}:*", nil},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), nil},
		{`"` + strings.Repeat(`\"`, 255) + `"`, strings.Repeat(`"`, 255), nil},
		{"", "", errKeyEmpty},
		{`""`, "", errKeyEmpty},
		{strings.Repeat("k", 256), "", errKeyLong},
		{`"` + strings.Repeat("k", 256) + `"`, "", errKeyLong},
		{`"` + strings.Repeat(`\\`, 256) + `"`, "", errKeyLong},
		{"tab\there", "", errKeyChar},
		{"del\x7f", "", errKeyChar},
		{"é", "", errKeyChar},
		{`"é"`, "", errKeyChar},
		{`"`, "", errKeyQuote},
		{`"abc`, "", errKeyQuote},
		{`"a"b"`, "", errKeyQuote},
		{`"a\b"`, "", errKeyQuote},
		{`"abc\"`, "", errKeyQuote},
		{`abc"`, `abc"`, nil}, // a bare token may hold a quote that does not lead
	} {
		got, err := ParseKey(tc.in)
		if tc.err != nil {
			if !errors.Is(err, ErrInvalidKey) || !errors.Is(err, tc.err) {
				t.Errorf("ParseKey(%q) error = %v, want %v wrapping ErrInvalidKey", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseKey checks that any accepted key is 1 to 255 printable bytes,
// that its quoted form parses back to it, and that nothing panics.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"\\"`, "", `"`, strings.Repeat("x", 256), "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := ParseKey(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			return
		}
		if len(key) == 0 || len(key) > MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: bad length", in, key)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %#x", in, key, key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := ParseKey(quoted); err != nil || again != key {
			t.Fatalf("quoted form %q of %q parses to %q, %v", quoted, key, again, err)
		}
	})
}

// TestCheckKey: CheckKey takes a key as it stands, as Do does: quotes are
// part of it; a bad key wraps ErrInvalidKey.
func TestCheckKey(t *testing.T) {
	for _, k := range []string{"abc", `"abc"`, `a"b\c`, strings.Repeat("k", 255), " "} {
		if err := CheckKey(k); err != nil {
			t.Errorf("CheckKey(%q): %v", k, err)
		}
	}
	for _, k := range []string{"", strings.Repeat("k", 256), "a\x01", "ordér", "tab\t"} {
		if err := CheckKey(k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("CheckKey(%q): %v, want ErrInvalidKey", k, err)
		}
	}
}

func TestStorageKeySeparatesFields(t *testing.T) {
	seen := map[string][4]string{}
	for _, f := range [][4]string{
		{"", "POST", "/a", "k"},
		{"", "POST", "/a", "k2"},
		{"", "POST", "/a2", "k"},
		{"", "PATCH", "/a", "k"},
		{"alice", "POST", "/a", "k"},
		{"alic", "POST", "e/a", "k"}, // shifting bytes between fields must not collide
		{"", "POST", "/ak", ""},
		{"", "POST", "/a", "{tag}"},
		{"", "POST", "/a", "*"},
	} {
		k := storageKey(f[0], f[1], f[2], f[3])
		if prev, ok := seen[k]; ok {
			t.Fatalf("storageKey%v == storageKey%v", f, prev)
		}
		seen[k] = f
		if len(k) != 22 || strings.ContainsAny(k, "{}:* ") {
			t.Fatalf("storageKey%v = %q: want 22 base64url characters", f, k)
		}
	}
}

// storageKey is appendStorageKey as a string.
func storageKey(scope, method, route, key string) string {
	h := getHasher()
	defer putHasher(h)
	var b [storageKeyLen]byte
	return string(h.appendStorageKey(b[:0], scope, method, route, key))
}
