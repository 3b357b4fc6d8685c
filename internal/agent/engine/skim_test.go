package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// skimMemo is a memo that remembers the list [1,22,333], as a session's
// memo remembers its last render.
func skimMemo(t testing.TB) *Memo {
	var m Memo
	_, _, err := readTokenizeSteps([]byte(`{"tokens":[1,22,333]}`), &m)
	require.NoError(t, err)
	return &m
}

// checkSkim: wherever readTokenizeSkim takes a reply, readTokenizeSteps
// (through a memo in the same state) reads the same ids and max_model_len
// without an error.
func checkSkim(t testing.TB, body []byte) bool {
	ids, maxLen, ok := readTokenizeSkim(body, skimMemo(t))
	if !ok {
		return false
	}
	want, wantLen, err := readTokenizeSteps(body, skimMemo(t))
	if err != nil || !reflect.DeepEqual(ids, want) || maxLen != wantLen {
		t.Fatalf("skim %v %d, steps %v %d %v: %s", ids, maxLen, want, wantLen, err, body)
	}
	return true
}

// readTokenizeSkim takes the replies vLLM writes and never reads one
// otherwise than readTokenizeSteps: keys repeated, case-folded or escaped,
// values encoding/json refuses anywhere in the reply, lists the memo
// refuses, counts that disagree.
func TestSkimTokenize(t *testing.T) {
	took := 0
	for _, body := range []string{
		`{"count":3,"max_model_len":4096,"tokens":[1,22,333],"token_strs":null}`,
		`{"count":4,"max_model_len":4096,"tokens":[1,22,333,4],"token_strs":null}`,
		` { "tokens" : [ ] , "count" : 0 } `,
		`{"tokens":[1,22]}`,
		`{"tokens":[1,22,3334]}`,
		`{"tokens":[5],"extra":{"a":["]",{"b":"}"}]},"max_model_len":null}`,
		`{"tokens":[1,2],"tokens":[3]}`,
		`{"tokens":"x","tokens":[3]}`,
		`{"tokens":[1,2],"tokens":null}`,
		`{"TOKENS":[1,2],"Count":2}`,
		`{"tok\u0065ns":[1,2]}`,
		"{\"tokens\":[1],\"a\tb\":1}",
		`{"tokens":[1],"count":1,"count":null}`,
		`{"tokens":[1],"count":2}`,
		`{"tokens":[1],"max_model_len":"5"}`,
		`{"tokens":[1],"max_model_len":5.5}`,
		`{"tokens":[1],"token_strs":[tru]}`,
		`{"tokens":[1],"token_strs":["\x"]}`,
		`{"tokens":[1],"x":01}`,
		`{"tokens":[1,22,333,]}`,
		`{"tokens":[1,22,-333]}`,
		`{"tokens":[1,22,333,4x]}`,
		`{"tokens":[2147483648]}`,
		`{"tokens":[1.0]}`,
		`{"tokens":[1]} x`,
		`{"tokens":[1]}{}`,
		`{"tokens":[1],}`,
		`{"tokens":null}`,
		`[1]`,
	} {
		if checkSkim(t, []byte(body)) {
			took++
		}
	}
	assert.GreaterOrEqual(t, took, 6)
}

// FuzzSkimTokenize: wherever readTokenizeSkim takes a reply,
// readTokenizeSteps reads the same.
func FuzzSkimTokenize(f *testing.F) {
	f.Add([]byte(`{"count":4,"max_model_len":4096,"tokens":[1,22,333,4],"token_strs":null}`))
	f.Add([]byte(`{"tokens":[1,22,33],"x":{"a":[1,"]"]}}`))
	f.Fuzz(func(t *testing.T, body []byte) { checkSkim(t, body) })
}

// BenchmarkReadTokenizeMemo reads a turn's /tokenize reply through the
// session's memo: 5,000 ids the memo remembers and 60 new ones, as the
// adapter's reuse path sees every turn. kiln's reading (readTokenizeSkim)
// and the baseline, encoding/json's (readTokenizeSteps), in the same run;
// ÷steps is the ratio of their times.
func BenchmarkReadTokenizeMemo(b *testing.B) {
	ids := make([]int32, 5060)
	for i := range ids {
		ids[i] = int32((i * 7919) % 151643)
	}
	reply := func(ids []int32) []byte {
		return append(append([]byte(`{"count":`+strconv.Itoa(len(ids))+`,"max_model_len":32768,"tokens":`), appendIDs(nil, ids)...), `,"token_strs":null}`...)
	}
	prev, body := reply(ids[:5000]), reply(ids)
	prime := func() *Memo {
		var m Memo
		if _, _, err := readTokenizeSteps(prev, &m); err != nil {
			b.Fatal(err)
		}
		return &m
	}
	time1 := func(read func([]byte, *Memo) ([]int32, int, bool)) time.Duration {
		const rounds = 200
		var total time.Duration
		for range rounds {
			m := prime()
			t0 := time.Now()
			if got, _, ok := read(body, m); !ok || len(got) != len(ids) {
				b.Fatal("not read")
			}
			total += time.Since(t0)
		}
		return total / rounds
	}
	steps := time1(func(body []byte, m *Memo) ([]int32, int, bool) {
		ids, n, err := readTokenizeSteps(body, m)
		return ids, n, err == nil
	})
	b.SetBytes(int64(len(body)))
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		m := prime()
		b.StartTimer()
		t0 := time.Now()
		if got, _, ok := readTokenizeSkim(body, m); !ok || len(got) != len(ids) {
			b.Fatal("not read")
		}
		total += time.Since(t0)
	}
	skim := total / time.Duration(b.N)
	b.ReportMetric(float64(skim.Nanoseconds())/1e3, "skim-µs")
	b.ReportMetric(float64(steps.Nanoseconds())/1e3, "steps-µs")
	b.ReportMetric(float64(steps)/float64(skim), "÷steps")
}

// decodeIDs reads what json.Unmarshal into []int64 reads as non-negative
// int32s, null elements as 0, and refuses the rest.
func TestDecodeIDs(t *testing.T) {
	for _, raw := range []string{
		`[1,22,333]`, ` [ 1 , 2 ] `, `[]`, `[null,5]`, `[-0]`, `[0,2147483647]`, `[2147483648]`, `[-1]`,
		`[1.0]`, `[1e3]`, `[01]`, `[+1]`, `["1"]`, `[true]`, `[[1]]`, `[{}]`, `[1,]`, `[,1]`, `[1 2]`, `null`, `{}`,
		`[1]x`, `[9223372036854775808]`, ``, `[`,
	} {
		got, ok := decodeIDs([]byte(raw))
		var vals []int64
		want := json.Unmarshal([]byte(raw), &vals) == nil && vals != nil &&
			!slices.ContainsFunc(vals, func(v int64) bool { return v < 0 || v > math.MaxInt32 })
		if !assert.Equal(t, want, ok, raw) || !ok {
			continue
		}
		ids := make([]int32, len(vals))
		for i, v := range vals {
			ids[i] = int32(v)
		}
		assert.Equal(t, ids, got, raw)
	}
}

// FuzzDecodeIDs: decodeIDs agrees with json.Unmarshal into []int64.
func FuzzDecodeIDs(f *testing.F) {
	f.Add([]byte(`[1,22,333]`))
	f.Add([]byte(`[null, 5 ,0]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := decodeIDs(raw)
		var vals []int64
		want := json.Unmarshal(raw, &vals) == nil && vals != nil &&
			!slices.ContainsFunc(vals, func(v int64) bool { return v < 0 || v > math.MaxInt32 })
		if ok != want {
			t.Fatalf("decodeIDs ok %v, encoding/json %v: %q", ok, want, raw)
		}
		for i := range got {
			if int64(got[i]) != vals[i] {
				t.Fatalf("element %d: %d, encoding/json %d: %q", i, got[i], vals[i], raw)
			}
		}
	})
}

// BenchmarkDecodeIDs reads a 300-id list (a turn's new ids past the
// memo's): decodeIDs beside json.Unmarshal into []int64, its baseline, in
// the same run; ÷unmarshal is the ratio of their times.
func BenchmarkDecodeIDs(b *testing.B) {
	ids := make([]int32, 300)
	for i := range ids {
		ids[i] = int32((i * 7919) % 151643)
	}
	raw := appendIDs(nil, ids)
	const rounds = 1000
	t0 := time.Now()
	for range rounds {
		var vals []int64
		if json.Unmarshal(raw, &vals) != nil || len(vals) != len(ids) {
			b.Fatal("not read")
		}
	}
	base := time.Since(t0) / rounds
	b.SetBytes(int64(len(raw)))
	t0 = time.Now()
	for b.Loop() {
		if got, ok := decodeIDs(raw); !ok || len(got) != len(ids) {
			b.Fatal("not read")
		}
	}
	kiln := time.Since(t0) / time.Duration(b.N)
	b.ReportMetric(float64(base.Nanoseconds())/1e3, "unmarshal-µs")
	b.ReportMetric(float64(base)/float64(kiln), "÷unmarshal")
}

// tokenID reads every text as strconv.ParseInt followed by the int32
// range check reads it.
func FuzzTokenID(f *testing.F) {
	for _, s := range []string{"0", "-0", "+5", "007", "2147483647", "2147483648", "-1", "1.0", "1e3", " 12 ", "", "-", "99999999999999999999", "0x1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := tokenID(raw)
		v, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
		want := err == nil && v >= 0 && v <= math.MaxInt32
		if ok != want || ok && int64(got) != v {
			t.Fatalf("tokenID %d %v, ParseInt %d %v: %q", got, ok, v, err, raw)
		}
	})
}
