// Package ojson is the agent runtime's JSON: ordered objects, a decoder
// with encoding/json's semantics (and Python json.loads(strict=False) as a
// lenient mode), a compact writer, a Python json.dumps writer for what
// chat templates render, and skimmers that find where values start and
// end without decoding them.
//
// Decoded values are nil, bool, json.Number, string, []any and *Object. An
// *Object keeps its keys in document order and a repeated key keeps its
// first position and takes its last value, as a Python dict does: tool
// arguments and schemas reach the chat template in the order the client
// sent them, and templates iterate objects in insertion order.
package ojson

import "iter"

// Object is a JSON object that keeps its keys in insertion order. The zero
// value is an empty object ready to use; a nil *Object reads as empty.
type Object struct {
	keys []string
	vals []any
	// index maps each key to its position once there are indexAt of them,
	// so that building a large object (a hostile one: model output) costs
	// no scan of all the keys before each.
	index map[string]int
	// The first fields' room, in the same allocation: most objects of a
	// chat request (messages, content blocks) have a handful of keys.
	keyRoom [objectRoom]string
	valRoom [objectRoom]any
}

const objectRoom = 4

// indexAt is the field count from which an Object keeps its index.
const indexAt = 16

// NewObject returns an empty object with room for n fields.
func NewObject(n int) *Object {
	o := &Object{}
	if n <= objectRoom {
		o.keys, o.vals = o.keyRoom[:0], o.valRoom[:0]
	} else {
		o.keys, o.vals = make([]string, 0, n), make([]any, 0, n)
	}
	return o
}

// Obj builds an object from alternating keys (strings) and values.
func Obj(kv ...any) *Object {
	o := NewObject(len(kv) / 2)
	for i := 0; i+1 < len(kv); i += 2 {
		o.Set(kv[i].(string), kv[i+1])
	}
	return o
}

// Len is the number of fields.
func (o *Object) Len() int {
	if o == nil {
		return 0
	}
	return len(o.keys)
}

// Get returns the value of k and whether k is present.
func (o *Object) Get(k string) (any, bool) {
	if o == nil {
		return nil, false
	}
	if o.index != nil {
		if i, ok := o.index[k]; ok {
			return o.vals[i], true
		}
		return nil, false
	}
	for i, key := range o.keys {
		if key == k {
			return o.vals[i], true
		}
	}
	return nil, false
}

// Val returns the value of k, nil when absent.
func (o *Object) Val(k string) any {
	v, _ := o.Get(k)
	return v
}

// Str returns the value of k when it is a string.
func (o *Object) Str(k string) (string, bool) {
	s, ok := o.Val(k).(string)
	return s, ok
}

// Set sets k to v: in its place when k is present, else at the end.
func (o *Object) Set(k string, v any) {
	if o.index == nil && len(o.keys) >= indexAt {
		o.index = make(map[string]int, 2*indexAt)
		for i, key := range o.keys {
			o.index[key] = i
		}
	}
	if o.index != nil {
		if i, ok := o.index[k]; ok {
			o.vals[i] = v
			return
		}
		o.index[k] = len(o.keys)
	} else {
		for i, key := range o.keys {
			if key == k {
				o.vals[i] = v
				return
			}
		}
	}
	o.keys = append(o.keys, k)
	o.vals = append(o.vals, v)
}

// All yields the fields in order.
func (o *Object) All() iter.Seq2[string, any] {
	return func(yield func(string, any) bool) {
		if o == nil {
			return
		}
		for i, k := range o.keys {
			if !yield(k, o.vals[i]) {
				return
			}
		}
	}
}
