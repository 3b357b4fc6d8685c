package ojson

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// intsCases are inputs DecodeInts must read as encoding/json reads them
// into a []int.
var intsCases = []string{
	`null`, ` null `, `nul`, `nullx`, `[]`, ` [ ] `, `[1]`, `[0,1,2]`, ` [ 1 , 2 ] `, "[1,\n\t2]",
	`[null]`, `[1,null,3]`, `[nul]`, `[nullx]`, `[-1]`, `[-0]`, `[01]`, `[00]`, `[1.0]`, `[1e2]`, `[1E2]`, `[-]`, `[+1]`,
	`[9223372036854775807]`, `[9223372036854775808]`, `[-9223372036854775808]`, `[-9223372036854775809]`,
	`[99999999999999999999]`, `["1"]`, `[true]`, `[false]`, `[[1]]`, `[{}]`, `[1,]`, `[,1]`, `[1 2]`, `[1`, `1`,
	`{}`, `"x"`, ``, ` `, `[1]x`, `[1] [2]`, `[1]]`, `[1a]`, `[0x1]`, `[-01]`, `[1,-]`,
}

func TestDecodeInts(t *testing.T) {
	for _, in := range intsCases {
		checkInts(t, in)
	}
}

func checkInts(t *testing.T, in string) {
	t.Helper()
	var want []int
	wantOK := json.Unmarshal([]byte(in), &want) == nil
	got, ok := DecodeInts([]byte(in))
	if ok != wantOK {
		t.Fatalf("DecodeInts(%q) ok = %v, encoding/json %v", in, ok, wantOK)
	}
	if ok && (!slices.Equal(got, want) || (got == nil) != (want == nil)) {
		t.Fatalf("DecodeInts(%q) = %#v, encoding/json %#v", in, got, want)
	}
}

func FuzzDecodeInts(f *testing.F) {
	for _, in := range intsCases {
		f.Add(in)
	}
	f.Fuzz(checkInts)
}

// BenchmarkDecodeInts reads a 20k-token prompt's ids; ÷unmarshal is its
// time over encoding/json's Unmarshal of the same text, timed as many
// times in the same run.
func BenchmarkDecodeInts(b *testing.B) {
	parts := make([]string, 20000)
	for i := range parts {
		parts[i] = fmt.Sprint((i * 37) % 265)
	}
	raw := []byte("[" + strings.Join(parts, ",") + "]")
	b.SetBytes(int64(len(raw)))
	n := 0
	start := time.Now()
	for b.Loop() {
		if _, ok := DecodeInts(raw); !ok {
			b.Fatal("refused")
		}
		n++
	}
	own := time.Since(start)
	start = time.Now()
	for range n {
		var ids []int
		if err := json.Unmarshal(raw, &ids); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(own)/float64(time.Since(start)), "÷unmarshal")
}
