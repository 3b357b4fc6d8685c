package records

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// object is a JSON object that keeps its keys in order and its values as
// the exact source text, so rows pass through kiln without reformatting
// numbers, escapes or key order.
type object []member

type member struct {
	Key string
	Val json.RawMessage
}

func parseObject(data []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want a JSON object, got %s", shortJSON(data))
	}
	var o object
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		o = append(o, member{tok.(string), v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	// dec.More is false before a stray '}' or ']', so look at the bytes.
	if rest := bytes.TrimSpace(data[dec.InputOffset():]); len(rest) > 0 {
		return nil, fmt.Errorf("trailing data %s after JSON object", shortJSON(rest))
	}
	return o, nil
}

func (o object) get(key string) (json.RawMessage, bool) {
	for _, m := range o {
		if m.Key == key {
			return m.Val, true
		}
	}
	return nil, false
}

// take removes key and returns its value.
func (o *object) take(key string) (json.RawMessage, bool) {
	for i, m := range *o {
		if m.Key == key {
			*o = append((*o)[:i:i], (*o)[i+1:]...)
			return m.Val, true
		}
	}
	return nil, false
}

// set replaces key's value in place, or appends it.
func (o *object) set(key string, val json.RawMessage) {
	for i := range *o {
		if (*o)[i].Key == key {
			(*o)[i].Val = val
			return
		}
	}
	*o = append(*o, member{key, val})
}

func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, m.Key)
		b.WriteByte(':')
		b.Write(m.Val)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	b.Truncate(b.Len() - 1) // Encode's newline
}

func jsonString(s string) json.RawMessage {
	var b bytes.Buffer
	writeJSONString(&b, s)
	return b.Bytes()
}

// asString returns v's value if v is a JSON string.
func asString(v json.RawMessage) (string, bool) {
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

func shortJSON(b []byte) string {
	if len(b) > 60 {
		return string(b[:60]) + "..."
	}
	return string(b)
}

func ptr(s string) *string { return &s }
