package ojson

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Valid answers as encoding/json's Valid does.
func TestValid(t *testing.T) {
	cases := []string{
		`{}`, `[]`, ` {"a":[1,2,{"b":null}],"c":"d"} `, `"\u00e9\n\"\\\/\b\f\r\t"`, `-0`, `0.5e+10`, `1E-2`, `true`, `false`, `null`,
		`01`, `+1`, `.5`, `1.`, `1e`, `1e+`, `-`, `--1`, `0x1`, `NaN`, `Infinity`, `tru`, `nul`, `truex`,
		`{"a":1,}`, `[1,]`, `[,1]`, `{"a" 1}`, `{a:1}`, `{"a":1 "b":2}`, `[1 2]`, `{"a"}`, `{1:2}`,
		`"\x"`, `"\u12"`, `"\u12g4"`, "\"a\tb\"", "\"\x7f\"", "\"\xff\xfe\"", `"abc`, `"\`, `[`, `{`, `{"a":`, ``, ` `,
		`{} {}`, `[] x`, `1 2`, "\x00", `[1]]`,
	}
	for _, depth := range []int{MaxDepth - 1, MaxDepth, MaxDepth + 1} {
		cases = append(cases, strings.Repeat("[", depth)+strings.Repeat("]", depth))
		cases = append(cases, strings.Repeat(`{"a":`, depth)+"1"+strings.Repeat("}", depth))
	}
	for _, c := range cases {
		if got, want := Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%.60q) = %v, encoding/json %v", c, got, want)
		}
	}
}

// FuzzValid: Valid and encoding/json's Valid give the same answer.
func FuzzValid(f *testing.F) {
	for _, s := range []string{`{"a":[1,-2.5e3,"x\u0041"],"b":{"c":null,"d":true}}`, `[01]`, `"\ud800"`, `{"a":1,}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid %v, encoding/json %v: %q", got, want, b)
		}
	})
}

// BenchmarkValid checks a 21 kB generate reply (148 logprob entries, the
// engine client's every turn): Valid beside encoding/json's Valid, its
// baseline, in the same run; ÷json is the ratio of their times.
func BenchmarkValid(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"request_id":"generate-tokens-r1","output_mode":"tokens","choices":[{"index":0,"finish_reason":"stop","token_ids":[`)
	for i := range 148 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, (i*7919)%151643)
	}
	sb.WriteString(`],"logprobs":{"content":[`)
	for i := range 148 {
		if i > 0 {
			sb.WriteByte(',')
		}
		id, lp := (i*7919)%151643, -float64(i%17)*0.0731234567891-0.000012338161468505859
		fmt.Fprintf(&sb, `{"token_id":%d,"logprob":%v,"rank":1,"top_logprobs":[{"token_id":%d,"logprob":%v,"rank":1}]}`, id, lp, id, lp)
	}
	sb.WriteString(`]}}],"usage":{"prompt_tokens":4000,"completion_tokens":148,"prompt_tokens_details":null}}`)
	body := []byte(sb.String())
	const rounds = 200
	t0 := time.Now()
	for range rounds {
		if !json.Valid(body) {
			b.Fatal("invalid")
		}
	}
	base := time.Since(t0) / rounds
	b.SetBytes(int64(len(body)))
	t0 = time.Now()
	for b.Loop() {
		if !Valid(body) {
			b.Fatal("invalid")
		}
	}
	kiln := time.Since(t0) / time.Duration(b.N)
	b.ReportMetric(float64(base.Nanoseconds())/1e3, "json-µs")
	b.ReportMetric(float64(base)/float64(kiln), "÷json")
}

func TestValidValue(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	for _, c := range []struct {
		in       string
		i, depth int
		want     int
	}{
		{`{"a":[1,2]} x`, 5, 1, 10}, {`{"a":[1,]}`, 5, 1, -1}, {`"x\q"`, 0, 0, -1}, {`true,`, 0, 0, 4},
		{deep, 0, 0, len(deep)}, {deep, 0, 1, -1},
	} {
		if got := ValidValue([]byte(c.in), c.i, c.depth); got != c.want {
			t.Errorf("ValidValue(%.20q, %d, %d) = %d, want %d", c.in, c.i, c.depth, got, c.want)
		}
	}
}

// ValidArrayTail checks an array's rest from after an element, as Valid
// would check the whole array; NumberEnd ends a number where the grammar
// does, bounds included.
func TestValidArrayTailNumberEnd(t *testing.T) {
	for _, c := range []struct {
		in   string
		i    int
		want int
	}{
		{`[1, {"a":"b\n"} ] x`, 2, 17}, {`[1]`, 2, 3}, {`[1 ,2]`, 2, 6}, {`[1,]`, 2, -1}, {`[1 2]`, 2, -1},
		{`[1,"\x"]`, 2, -1}, {`[1,2`, 2, -1}, {`[1`, 2, -1},
	} {
		if got := ValidArrayTail([]byte(c.in), c.i, 1); got != c.want {
			t.Errorf("ValidArrayTail(%q, %d) = %d, want %d", c.in, c.i, got, c.want)
		}
	}
	for _, c := range []struct {
		in   string
		want int
	}{
		{`0`, 1}, {`-0,`, 2}, {`12.5e-3]`, 7}, {`1E+2`, 4}, {`01`, 1}, {`-`, -1}, {`1.`, -1}, {`1e`, -1}, {`1e+`, -1}, {`.5`, -1}, {``, -1},
	} {
		if got := NumberEnd([]byte(c.in), 0); got != c.want {
			t.Errorf("NumberEnd(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}
