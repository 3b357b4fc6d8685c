package enginetest

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzFastJSON checks the decoding fast paths against the encoding/json
// paths they stand for: where a fast path answers, its answer is theirs.
func FuzzFastJSON(f *testing.F) {
	for _, s := range []string{
		`{"token_ids":[1,2,3],"sampling_params":{"max_tokens":16,"temperature":0.5e-3}}`,
		` { "a" : [ 1 , -2 , 0 ] , "a" : null , "b" : "x\u00e9\n" } trailing`,
		`{"messages":[{"role":"user","content":"héllo \"q\" \ud83d\ude00"}],"tools":null}`,
		`{"k":true,"f":false,"n":null,"o":{},"e":[],"z":-0.0,"big":123456789012345678901}`,
		`[0,01]`, `[1.0]`, `[1e2]`, `[-]`, `[1,]`, `[,1]`, `[ ]`, `[]x`, `null`, `{"a":1`, `{"a" 1}`,
		`{"\u0061":1}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", `{"a":"\x"}`, `{"a":"\u12"}`, `{"a":tru}`,
		`[` + strings.Repeat("[", 20) + strings.Repeat("]", 20) + `]`,
		`[123456789012345678, -123456789012345678]`, `[1234567890123456789]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, ok := splitObject(b); ok {
			want, aerr := decodeBodySlow(b)
			if aerr != nil {
				t.Fatalf("splitObject(%q) = %v, encoding/json refuses it", b, m)
			}
			if len(m) != len(want) {
				t.Fatalf("splitObject(%q) = %q, encoding/json %q", b, m, want)
			}
			for k, v := range want {
				if !bytes.Equal(m[k], v) {
					t.Fatalf("splitObject(%q)[%q] = %q, encoding/json %q", b, k, m[k], v)
				}
			}
		}
		if ids, ok := parseInts(b); ok {
			var want []int
			if err := json.Unmarshal(b, &want); err != nil || !reflect.DeepEqual(ids, want) || (ids == nil) != (want == nil) {
				t.Fatalf("parseInts(%q) = %v, encoding/json %v (%v)", b, ids, want, err)
			}
		}
		if v, ok := fastOrdered(b); ok {
			want, err := decodeOrdered(b)
			if err != nil || !reflect.DeepEqual(v, want) {
				t.Fatalf("fastOrdered(%q) = %#v, encoding/json %#v (%v)", b, v, want, err)
			}
		}
		if s := string(b); plainASCII(s) {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(s)
			if got := encodeJSON(s); string(got)+"\n" != buf.String() {
				t.Fatalf("encodeJSON(%q) = %s, encoding/json %s", s, got, buf.String())
			}
		}
	})
}

// TestFastJSONAnswers checks that the fast paths answer the shapes clients
// send (declining is always correct, so FuzzFastJSON alone cannot tell).
func TestFastJSONAnswers(t *testing.T) {
	body := []byte(`{"model":"m","token_ids":[3, 256,0],"sampling_params":{"max_tokens":8},"messages":[{"role":"user","content":"a\nb"}]}`)
	m, ok := splitObject(body)
	if !ok || len(m) != 4 || string(m["token_ids"]) != "[3, 256,0]" {
		t.Fatalf("splitObject = %q, %v", m, ok)
	}
	if ids, ok := parseInts(m["token_ids"]); !ok || !reflect.DeepEqual(ids, []int{3, 256, 0}) {
		t.Fatalf("parseInts = %v, %v", ids, ok)
	}
	v, ok := fastOrdered(m["messages"])
	if !ok {
		t.Fatal("fastOrdered declined a message list")
	}
	o := v.([]any)[0].(*object)
	if c, _ := o.get("content"); c != "a\nb" || !reflect.DeepEqual(o.keys, []string{"role", "content"}) {
		t.Fatalf("fastOrdered = %#v", o)
	}
}

func TestAppendInts(t *testing.T) {
	ids := []int{0, 7, 10, 99, 100, 999, 1000, 9999, 10000, 99999, 100000, 151643, -1, -100000}
	want, _ := json.Marshal(ids)
	if got := appendInts(nil, ids); string(got) != string(want) {
		t.Errorf("appendInts = %s, want %s", got, want)
	}
	if got := appendInts(nil, nil); string(got) != "[]" {
		t.Errorf("appendInts(nil) = %s", got)
	}
}
