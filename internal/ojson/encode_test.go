package ojson

import (
	"encoding/json"
	"math"
	"testing"
)

// TestAppendObject: compact, keys in order, no HTML escaping, U+2028 raw,
// control characters escaped, invalid UTF-8 as U+FFFD, raw values verbatim
// (empty: null).
func TestAppendObject(t *testing.T) {
	if got := string(Marshal(&Object{})); got != "{}" {
		t.Fatalf("empty: %s", got)
	}
	o := Obj("z", "<a href=\"x\">&\u2028\x01\n\xff", "a", json.RawMessage(`[1,{"b":null}]`), "n", json.RawMessage(nil))
	want := `{"z":"<a href=\"x\">&` + "\u2028" + `\u0001\n` + "\ufffd" + `","a":[1,{"b":null}],"n":null}`
	if got := string(Marshal(o)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if !json.Valid(Marshal(o)) {
		t.Fatal("invalid JSON")
	}
}

func TestAppend(t *testing.T) {
	nan := 0.0
	nan /= nan
	for _, c := range []struct {
		v    any
		want string
	}{
		{nil, `null`}, {true, `true`}, {json.Number("-1.5e3"), `-1.5e3`}, {7, `7`}, {int64(-8), `-8`},
		{-0.1, `-0.1`}, {1e-7, `1e-07`}, {nan, `NaN`}, {[]int{0, 9, 10, 99, 100, 999, 1000, 99999, 100000, -1}, `[0,9,10,99,100,999,1000,99999,100000,-1]`},
		{[]int(nil), `[]`}, {[]string{"a", "é"}, `["a","é"]`}, {[]*Object{Obj("k", 1)}, `[{"k":1}]`},
		{(*Object)(nil), `null`}, {[]any{}, `[]`}, {map[string]string{"<": ">"}, `{"<":">"}`},
	} {
		if got := string(Append(nil, c.v)); got != c.want {
			t.Errorf("Append(%#v) = %s, want %s", c.v, got, c.want)
		}
	}
}

// TestAppendPy: json.dumps of what json.loads gave, both ensure_ascii
// settings (the expected texts are CPython 3.12's).
func TestAppendPy(t *testing.T) {
	for _, c := range []struct {
		in           string
		ascii, plain string
	}{
		{`{"b":[1,2.0,-0,1e5,1E-5,1.5e16,1e400,-1e400,0.0001,123.456],"a":{}}`,
			`{"b": [1, 2.0, 0, 100000.0, 1e-05, 1.5e+16, Infinity, -Infinity, 0.0001, 123.456], "a": {}}`, ""},
		{`["é\u2028😀\u007f<&>","\u0001\t\n\"\\/"]`,
			`["\u00e9\u2028\ud83d\ude00\u007f<&>", "\u0001\t\n\"\\/"]`, "[\"é\u2028😀\x7f<&>\", \"\\u0001\\t\\n\\\"\\\\/\"]"},
		{`[true,false,null,""]`, `[true, false, null, ""]`, ""},
	} {
		v, err := Decode([]byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(AppendPy(nil, v, true)); got != c.ascii {
			t.Errorf("AppendPy(%s, ascii)\n got %s\nwant %s", c.in, got, c.ascii)
		}
		plain := c.plain
		if plain == "" {
			plain = c.ascii
		}
		if got := string(AppendPy(nil, v, false)); got != plain {
			t.Errorf("AppendPy(%s)\n got %s\nwant %s", c.in, got, plain)
		}
	}
}

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0.0", 1: "1.0", -2.5: "-2.5", 1e16: "1e+16", 9999999999999998: "9999999999999998.0",
		1e-4: "0.0001", 1e-5: "1e-05", 1.5e300: "1.5e+300", 5e-324: "5e-324", 0.30000000000000004: "0.30000000000000004",
	} {
		if got := PyFloat(f); got != want {
			t.Errorf("PyFloat(%v) = %s, want %s", f, got, want)
		}
	}
}

func TestDecodeLenient(t *testing.T) {
	for _, c := range []struct {
		in, want string // want "": refused
	}{
		{"\"a\nb\"", `"a\nb"`},
		{"{\"k\x01\":\"\t\"}", `{"k\u0001":"\t"}`},
		{`"\ud800x"`, `"` + "\ufffd" + `x"`},
		{`NaN`, ""}, {`-Infinity`, ""}, {`[1,]`, ""}, {`"\x"`, ""}, {"\"a\n", ""},
	} {
		v, err := DecodeLenient([]byte(c.in))
		got := ""
		if err == nil {
			got = string(Marshal(v))
		}
		if got != c.want {
			t.Errorf("DecodeLenient(%q) = %s (%v), want %s", c.in, got, err, c.want)
		}
		if _, err := Decode([]byte(c.in)); err == nil && c.want != "" && c.in[0] == '"' && c.in != `"\ud800x"` {
			t.Errorf("Decode(%q) took raw control characters", c.in)
		}
	}
}

// TestObjectIndex: past indexAt keys an object still keeps the first
// position and the last value of a repeated key.
func TestObjectIndex(t *testing.T) {
	o := &Object{}
	for i := range 3 * indexAt {
		o.Set(string(rune('a'+i%(2*indexAt))), i)
	}
	if o.Len() != 2*indexAt {
		t.Fatalf("%d keys", o.Len())
	}
	if v, _ := o.Get("a"); v != 2*indexAt {
		t.Fatalf("a = %v", v)
	}
	i := 0
	for k := range o.All() {
		if k != string(rune('a'+i)) {
			t.Fatalf("key %d = %q", i, k)
		}
		i++
	}
}

func TestAppendFloat(t *testing.T) {
	for f, want := range map[float64]string{0: "0", -0.5: "-0.5", 1e-7: "1e-07", 1.5e16: "1.5e+16", -2.45: "-2.45",
		123.456: "123.456", math.Inf(1): "Infinity", math.Inf(-1): "-Infinity"} {
		if got := string(AppendFloat([]byte("x"), f)); got != "x"+want {
			t.Errorf("AppendFloat(%v) = %s, want x%s", f, got, want)
		}
	}
	if got := string(AppendFloat(nil, math.NaN())); got != "NaN" {
		t.Errorf("AppendFloat(NaN) = %s", got)
	}
}
