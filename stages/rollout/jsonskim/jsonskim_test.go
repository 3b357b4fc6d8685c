package jsonskim

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestValue(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int // index after the first value, -1 for none
	}{
		{`"a\"b",`, 6},
		{`"a\\"x`, 5},
		{`"open`, -1},
		{`{"a":[1,{"b":"}]"}]} tail`, 20},
		{`[1,2,3],`, 7},
		{`[[1],[2]]`, 9},
		{`{"a":1]`, -1},
		{`[1,2}`, -1},
		{`[{"a":1}`, -1},
		{`123.5e3}`, 7},
		{`true `, 4},
		{`,`, -1},
		{strings.Repeat("[", 100) + strings.Repeat("]", 100), 200},
	} {
		if got := Value([]byte(c.in), 0); got != c.want {
			t.Errorf("Value(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// On valid JSON, EachField and EachElem see what encoding/json sees.
func TestEachAgreesWithEncodingJSON(t *testing.T) {
	obj := `{"model":"m","messages":[{"role":"user","content":"a \"quoted\" } ] text"}],"n":-1.5e2,"ok":true,"z":null,"ids":[1,2,3]}`
	var want map[string]json.RawMessage
	if err := json.Unmarshal([]byte(obj), &want); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	if !EachField([]byte(obj), func(k, v []byte) bool { got[string(k)] = string(v); return true }) {
		t.Fatal("EachField refused a valid object")
	}
	if len(got) != len(want) {
		t.Fatalf("%d fields, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != string(v) {
			t.Errorf("field %s = %s, want %s", k, got[k], v)
		}
	}
	var elems []json.RawMessage
	arr := `[ {"a":[1]} , "x" , 3 , [] ]`
	if err := json.Unmarshal([]byte(arr), &elems); err != nil {
		t.Fatal(err)
	}
	var seen []string
	if !EachElem([]byte(arr), func(v []byte) bool { seen = append(seen, string(v)); return true }) {
		t.Fatal("EachElem refused a valid array")
	}
	if len(seen) != len(elems) {
		t.Fatalf("%d elements, want %d", len(seen), len(elems))
	}
	for i := range elems {
		if seen[i] != string(elems[i]) {
			t.Errorf("element %d = %s, want %s", i, seen[i], elems[i])
		}
	}
	for _, bad := range []string{`{"a":1,}`, `{"a" 1}`, `{"a":1} x`, `{1:2}`, `[1,]`, `[1 2]`, `{`, `[`} {
		if EachField([]byte(bad), func(k, v []byte) bool { return true }) ||
			EachElem([]byte(bad), func(v []byte) bool { return true }) {
			t.Errorf("%s accepted", bad)
		}
	}
}
