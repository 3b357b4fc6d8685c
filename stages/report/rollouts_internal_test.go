package report

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"
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

// TestRenderSteps: the steps are placed in step order whatever order the
// workers finish in, and the first error (a render's or a place's) stops
// the rest and is returned, without a hang.
func TestRenderSteps(t *testing.T) {
	steps := make([]*Step, 40)
	for i := range steps {
		steps[i] = &Step{Step: i + 1}
	}
	render := func(failAt int) func(context.Context, *Step) (*stepViews, error) {
		return func(ctx context.Context, s *Step) (*stepViews, error) {
			time.Sleep(time.Duration((s.Step*7919)%5) * time.Millisecond) // out of order
			if s.Step == failAt {
				return nil, fmt.Errorf("step %d broke", s.Step)
			}
			return &stepViews{order: []*Rollout{{ID: int64(s.Step)}}}, ctx.Err()
		}
	}
	var placed []int
	place := func(s *Step, sv *stepViews) error {
		if sv.order[0].ID != int64(s.Step) {
			t.Errorf("step %d placed with step %d's views", s.Step, sv.order[0].ID)
		}
		placed = append(placed, s.Step)
		return nil
	}
	if err := renderSteps(context.Background(), steps, render(0), place); err != nil {
		t.Fatal(err)
	}
	for i, s := range placed {
		if s != i+1 {
			t.Fatalf("placed %v, want steps 1..40 in order", placed)
		}
	}
	placed = nil
	err := renderSteps(context.Background(), steps, render(9), place)
	if err == nil || err.Error() != "step 9 broke" {
		t.Fatalf("err %v, want step 9's", err)
	}
	if len(placed) != 8 {
		t.Errorf("placed %v, want steps 1..8 and none after the failure", placed)
	}
	placed = nil
	err = renderSteps(context.Background(), steps, render(0), func(s *Step, sv *stepViews) error {
		if s.Step == 3 {
			return fmt.Errorf("disk full")
		}
		return place(s, sv)
	})
	if err == nil || err.Error() != "disk full" || len(placed) != 2 {
		t.Fatalf("err %v, placed %v; want disk full after steps 1, 2", err, placed)
	}
}
