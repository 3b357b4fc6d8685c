package ojson

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// referenceParse is the ordered decoding Decode replaced, over
// encoding/json's token stream: the oracle Decode must agree with on
// which inputs are JSON and what they hold.
func referenceParse(data []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var value func() (any, bool)
	value = func() (any, bool) {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return tok, true
		}
		switch d {
		case '{':
			o := &Object{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, false
				}
				k, _ := kt.(string)
				v, ok := value()
				if !ok {
					return nil, false
				}
				o.Set(k, v)
			}
			_, err := dec.Token()
			return o, err == nil
		case '[':
			a := []any{}
			for dec.More() {
				v, ok := value()
				if !ok {
					return nil, false
				}
				a = append(a, v)
			}
			_, err := dec.Token()
			return a, err == nil
		}
		return nil, false
	}
	v, ok := value()
	if !ok {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return v, true
}

var decodeCases = []string{
	`{"b":1,"a":[true,false,null,"x"],"b":2}`,
	` { "k" : -0.5e+3 , "z" : [ ] , "o" : { } } `,
	`"esc \" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00 \ud83d \ude00 \ud83dx \u0041"`,
	"\"raw \xff\xfe invalid utf-8 and é\"",
	`[1,2.0,-3e2,0.1E-2,1e400]`,
	`{"a":1}x`, `{"a":1,}`, `[1,]`, `[01]`, `-`, `1.`, `1e`, `.5`, `+1`, `tru`, `nul`, `"\x"`,
	"\"ctl \x01\"", `"\u12"`, `{"a"}`, `{"a":}`, `{1:2}`, `[`, `{`, `"abc`, ``, `   `, `[1 2]`, `{"a":1 "b":2}`,
	`{"a":{"b":{"c":[[[["deep"]]]]}}}`, `"\ud800\udc00"`, `"\udc00"`, `1 2`, `[] `,
}

func TestDecodeAgreesWithEncodingJSON(t *testing.T) {
	for _, in := range decodeCases {
		checkDecode(t, []byte(in))
	}
	// Real request bodies: the protocol decoders' committed requests.
	files, _ := filepath.Glob("../agent/protocol/testdata/requests/*.json")
	if len(files) == 0 {
		t.Fatal("no request bodies found")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checkDecode(t, b)
	}
}

func FuzzDecode(f *testing.F) {
	for _, in := range decodeCases {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkDecode(t, data) })
}

func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	got, err := Decode(data)
	want, ok := referenceParse(data)
	if (err == nil) != ok {
		t.Fatalf("Decode(%q): err %v, encoding/json ok=%v", data, err, ok)
	}
	if ok && !bytes.Equal(Marshal(got), Marshal(want)) {
		t.Fatalf("Decode(%q) = %s, encoding/json: %s", data, Marshal(got), Marshal(want))
	}
}
