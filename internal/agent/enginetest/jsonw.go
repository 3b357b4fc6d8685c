package enginetest

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

// encodeJSON writes v compactly with object keys in insertion order and
// without HTML escaping. Non-finite floats are written as Python's json
// module writes them (NaN, Infinity, -Infinity), which is what a Python
// server with allow_nan would send and what fault injection needs.
func encodeJSON(v any) []byte {
	var b bytes.Buffer
	b.Grow(1 << 10)
	writeJSON(&b, v)
	return b.Bytes()
}

func writeJSON(b *bytes.Buffer, v any) {
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case int:
		b.Write(strconv.AppendInt(b.AvailableBuffer(), int64(t), 10))
	case int64:
		b.WriteString(strconv.FormatInt(t, 10))
	case float64:
		switch {
		case math.IsNaN(t):
			b.WriteString("NaN")
		case math.IsInf(t, 1):
			b.WriteString("Infinity")
		case math.IsInf(t, -1):
			b.WriteString("-Infinity")
		default:
			b.Write(strconv.AppendFloat(b.AvailableBuffer(), t, 'g', -1, 64))
		}
	case json.Number:
		b.WriteString(string(t))
	case string:
		if plainASCII(t) {
			b.WriteByte('"')
			b.WriteString(t)
			b.WriteByte('"')
			return
		}
		enc := json.NewEncoder(b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(t)
		b.Truncate(b.Len() - 1) // Encode appends a newline
	case json.RawMessage:
		b.Write(t)
	case []int:
		b.Grow(len(t)*5 + 2)
		b.Write(appendInts(b.AvailableBuffer(), t))
	case []string:
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, e)
		}
		b.WriteByte(']')
	case []any:
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, e)
		}
		b.WriteByte(']')
	case *object:
		b.WriteByte('{')
		for i, k := range t.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, k)
			b.WriteByte(':')
			writeJSON(b, t.vals[i])
		}
		b.WriteByte('}')
	default:
		data, err := json.Marshal(t)
		if err != nil {
			panic(err)
		}
		b.Write(data)
	}
}

// obj builds an ordered object from alternating keys and values.
func obj(kv ...any) *object {
	o := &object{keys: make([]string, 0, len(kv)/2), vals: make([]any, 0, len(kv)/2)}
	for i := 0; i+1 < len(kv); i += 2 {
		o.set(kv[i].(string), kv[i+1])
	}
	return o
}

// plainASCII reports whether s is printable ASCII that JSON writes as it
// is (no quote or backslash), as encoding/json would write it.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// appendInts appends ids as a JSON array; token ids are small non-negative
// numbers, written without strconv's generality.
func appendInts(dst []byte, ids []int) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		switch {
		case id < 0 || id >= 100000:
			dst = strconv.AppendInt(dst, int64(id), 10)
		case id < 10:
			dst = append(dst, byte('0'+id))
		case id < 100:
			dst = append(dst, byte('0'+id/10), byte('0'+id%10))
		case id < 1000:
			dst = append(dst, byte('0'+id/100), byte('0'+id/10%10), byte('0'+id%10))
		default:
			var d [5]byte
			n := len(d)
			for ; id > 0; id /= 10 {
				n--
				d[n] = byte('0' + id%10)
			}
			dst = append(dst, d[n:]...)
		}
	}
	return append(dst, ']')
}
