package report

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestExtension: the fast path of a turn's new prompt messages agrees
// with splitting the whole prompt and skipping the previous prompt and
// response, and declines every prompt that is not the previous one
// extended byte for byte.
func TestExtension(t *testing.T) {
	const p1 = `[{"role":"system","content":"s"},{"role":"user","content":"u"}]`
	for _, tc := range []struct {
		name       string
		prev       string
		prompt     string
		ok         bool
		wantN      int
		wantFreshN int
	}{
		{"response and a tool output", p1, `[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"tool","content":"t"}]`, true, 4, 1},
		{"response only", p1, `[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"}]`, true, 3, 0},
		{"spaces kept", `[ {"a":1} ]`, `[ {"a":1} , {"b":2}, {"c":3} ]`, true, 3, 1},
		{"the same prompt", p1, p1, false, 0, 0},
		{"rewritten", p1, `[{"role":"system","content":"s"},{"role":"user","content":"v"},{"role":"assistant","content":"a"}]`, false, 0, 0},
		{"compacted", p1, `[{"role":"user","content":"summary"}]`, false, 0, 0},
		{"a number after the response", `[{"a":"x"}]`, `[{"a":"x"},1]`, true, 2, 0},
		{"the last message longer", `[{"a":"x"}]`, `[{"a":"xy"},1]`, false, 0, 0},
		{"prefix inside a string", `["ab"]`, `["ab","c"]`, true, 2, 0},
		{"invalid tail", p1, `[{"role":"system","content":"s"},{"role":"user","content":"u"},{]`, false, 0, 0},
		{"no previous prompt", "", p1, false, 0, 0},
		{"an empty previous prompt", `[]`, `[{"a":1},{"b":2}]`, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var prevMsgs []json.RawMessage
			prevN := 0
			if tc.prev != "" {
				if err := json.Unmarshal([]byte(tc.prev), &prevMsgs); err != nil {
					t.Fatal(err)
				}
				prevN = len(prevMsgs) + 1
			}
			n, fresh, ok := extension(tc.prev, prevN, tc.prompt)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if n != tc.wantN || len(fresh) != tc.wantFreshN {
				t.Fatalf("n %d, %d fresh; want %d, %d", n, len(fresh), tc.wantN, tc.wantFreshN)
			}
			// What the slow path gives: the whole prompt split, the
			// previous prompt and its response skipped.
			all, err := splitArray(tc.prompt)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(all) || !reflect.DeepEqual(fresh, all[prevN:]) {
				t.Fatalf("fast path: %d messages, fresh %s; the whole prompt: %d, %s", n, fresh, len(all), all[prevN:])
			}
		})
	}
}
