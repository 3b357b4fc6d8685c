package parse

import (
	"encoding/json"
	"testing"
)

func TestParseJSON(t *testing.T) {
	cases := []struct {
		in      string
		lenient bool
		want    string // "" = fails
	}{
		{in: ` {"b": [1, -0.5e+3, true, false, null], "a": "x"} `, want: `{"b":[1,-0.5e+3,true,false,null],"a":"x"}`},
		{in: `{"a":1,"a":2}`, want: `{"a":2}`},
		{in: "\"a\nb\"", want: ""},
		{in: "\"a\nb\"", lenient: true, want: `"a\nb"`},
		{in: `"\ud800x"`, want: `"` + "\ufffd" + `x"`},
		{in: `"\u12"`},
		{in: `"\x"`},
		{in: `01`},
		{in: `1.`},
		{in: `NaN`},
		{in: `-Infinity`},
		{in: `[1,]`},
		{in: `{"a" 1}`},
		{in: `{} x`},
		{in: "\v{}"},
		{in: `"unterminated`},
	}
	for _, c := range cases {
		v, ok := parseJSON(c.in, c.lenient)
		got := ""
		if ok {
			got = string(encode(v))
		}
		if got != c.want {
			t.Errorf("parseJSON(%q, %v) = %q, want %q", c.in, c.lenient, got, c.want)
		}
	}
}

func TestPyLiteral(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{'a': 1, "b": [True, False, None], 'c': (1,), 'd': ()}`, `{"a":1,"b":[true,false,null],"c":[1],"d":[]}`},
		{`{1: 'x', None: 'y', True: 'z', 1.5: 'w'}`, `{"1":"x","null":"y","true":"z","1.5":"w"}`},
		{`-5`, `-5`}, {`+5`, `5`}, {`-0`, `0`}, {`-0.0`, `-0.0`}, {`0x1F`, `31`}, {`0o17`, `15`}, {`0b101`, `5`}, {`1_000`, `1000`},
		{`1.0`, `1.0`}, {`1e5`, `100000.0`}, {`.5`, `0.5`}, {`1e-05`, `1e-05`}, {`1e16`, `1e+16`}, {`(5)`, `5`},
		{`'a' "b"`, `"ab"`}, {`u'x'`, `"x"`}, {`r'\n'`, `"\\n"`}, {`'''x'y'''`, `"x'y"`},
		{`'\x41\u00e9\101\q'`, `"Aé` + "A" + `\\q"`},
		{"  [1, 2,]  ", `[1,2]`},
		{`{1, 2}`, ""}, {`b'x'`, ""}, {`1j`, ""}, {`--5`, ""}, {`007`, ""}, {`foo`, ""}, {`1e999`, ""},
		{`[1`, ""}, {`'a`, ""}, {"'a\nb'", ""}, {`{(1,2): 3}`, ""}, {`f'x'`, ""}, {`'\N{DASH}'`, ""},
	}
	for _, c := range cases {
		v, ok := pyLiteral(c.in)
		got := ""
		if ok {
			got = string(encode(v))
			if !json.Valid([]byte(got)) {
				t.Errorf("pyLiteral(%q) invalid JSON %s", c.in, got)
			}
		}
		if got != c.want {
			t.Errorf("pyLiteral(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestNumbers(t *testing.T) {
	ints := map[string]string{"5": "5", " -07 ": "-7", "1_0": "10", "+0": "0", "1__0": "", "_1": "", "1.0": "", "": "", "-": ""}
	for in, want := range ints {
		got, ok := pyIntText(in)
		if !ok {
			got = ""
		}
		if got != want {
			t.Errorf("pyIntText(%q) = %q want %q", in, got, want)
		}
	}
	floats := map[string]string{"5": "5", "5.5": "5.5", "-2.0": "-2", ".25": "0.25", "3.": "3", "1e-7": "1e-07",
		"123456.75": "123456.75", "1e22": "10000000000000000000000", " 1_0.5 ": "10.5", "nan": "", "inf": "", "1e400": "", ".": "", "e5": "", "0x10": ""}
	for in, want := range floats {
		f, ok := pyFloat(in)
		got := ""
		if ok {
			got = floatJSON(f)
		}
		if got != want {
			t.Errorf("pyFloat(%q) = %q want %q", in, got, want)
		}
	}
}

func TestRepairEscapes(t *testing.T) {
	cases := map[string]string{
		`\d`:        `\\d`,
		`\\`:        `\\\`, // the second backslash ends the text: doubled, like the reference regex
		`\u00e9`:    `\u00e9`,
		`\u00g9`:    `\\u00g9`,
		`\u12`:      `\\u12`,
		`a\`:        `a\\`,
		`\"\/\b\f`:  `\"\/\b\f`,
		`\n\r\t\x`:  `\n\r\t\\x`,
		`no escape`: `no escape`,
	}
	for in, want := range cases {
		if got := repairEscapes(in); got != want {
			t.Errorf("repairEscapes(%q) = %q want %q", in, got, want)
		}
	}
}
