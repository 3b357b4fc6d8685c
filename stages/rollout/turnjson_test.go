package rollout

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// decodeAgrees decodes line with d and holds the result to the
// encoding/json path (decodeTurnJSON): where d accepts the line,
// encoding/json accepts it and makes the same turn, numbered the same way.
// It reports whether d accepted the line.
func decodeAgrees(t testing.TB, d *turnDecoder, line []byte) bool {
	t.Helper()
	got, hasTurn, ok := d.decode(line)
	if !ok {
		return false
	}
	want, err := decodeTurnJSON(line, map[string]int32{})
	if err != nil {
		t.Fatalf("turnDecoder accepted %q; encoding/json refuses it: %v", line, err)
	}
	// The turn number: from the line, or the caller's count. Records
	// refuse a negative turn, so two counts tell the line's own number
	// (the same with both) from the count.
	n1, err := decodeTurnJSON(line, map[string]int32{want.Session: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	n2, err := decodeTurnJSON(line, map[string]int32{want.Session: 1<<20 + 1})
	if err != nil {
		t.Fatal(err)
	}
	if given := n1.Turn == n2.Turn; given != hasTurn {
		t.Fatalf("turnDecoder says the line %s \"turn\", encoding/json disagrees: %q", map[bool]string{true: "has", false: "has no"}[hasTurn], line)
	}
	if !hasTurn {
		got.Turn = 0
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("turnDecoder and encoding/json differ on %q:\n got %+v\nwant %+v", line, got, want)
	}
	return true
}

// line is a turn record with the given fields in JSON text, in order.
func line(fields ...string) []byte { return []byte("{" + strings.Join(fields, ", ") + "}\n") }

const (
	fSession = `"session": "s1"`
	fPrompt  = `"prompt_ids": [1, 2, 3]`
	fOutput  = `"output_ids": [7, 8]`
	fLPs     = `"output_log_probs": [-0.5, -1.25e-3]`
	fMsgs    = `"prompt_messages": [{"role": "user", "content": "u"}]`
	fResp    = `"response_message": {"role": "assistant", "content": "a"}`
)

func TestTurnDecoder(t *testing.T) {
	accepted := [][]byte{
		line(fSession, fPrompt, fOutput, fLPs, fMsgs, fResp),
		line(fSession),
		line(fSession, `"index": 3, "group_index": 2, "rollout_id": 9223372036854775807, "turn": 4`),
		line(fSession, `"index": 9223372036854775807, "rollout_id": null, "turn": null`),
		line(fSession, `"finish_reason": "length", "ill_formed": true, "max_context_tokens": 2147483647`),
		line(fSession, `"finish_reason": "\ud800"`),
		line(fSession, `"finish_reason": "caf\u00e9\n", "ill_formed": false, "max_context_tokens": 2147483647`),
		line(`"session": "caf\u00e9 \"q\""`, `"reward": 1.5e2`),
		line(fSession, `"reward": null, "response_message": null`),
		line(fSession, `"response_message": "text"`, `"prompt_messages": []`),
		line(fSession, `"prompt_ids": [], "output_ids": [], "output_log_probs": []`),
		line(fSession, `"prompt_ids": [0, -0, 2147483647, 1000000000]`),
		line(fSession, `"output_ids": [5], "output_log_probs": [-3.4028234663852886e38]`),
		line(fSession, `"output_log_probs": [], "output_ids": [1, 2]`),
		line(fSession, `"output_ids": [1], "output_log_probs": [1e-50]`),
		line(fSession, `"output_ids": [1, 2], "rollout_top_p_token_offsets": [0, 1, 3], "rollout_top_p_token_ids": [1, 2, 3], "rollout_top_p_log_probs": [-1, -2, -3]`),
		line(fSession, `"rollout_topk_token_ids": [], "rollout_topk_log_probs": [0.5], "rollout_topk_k": 2`),
		line(fSession, `"rollout_routed_experts": [1, 2], "rollout_routed_experts_shape": [1, 1, 2]`),
		line(fSession, `"started_ms": 1700000000000, "duration_ms": null`),
		line(fSession, "\"prompt_messages\": [{\"c\": \"\xff\xfe\"}, 1, -2.5E+3, true, false, null, [[]], {}]"),
		[]byte("\t{ \"session\" : \"s\" , \"prompt_ids\" : [ 1 , 2 ] }\r\n"),
		[]byte(`{"session":"s","prompt_ids":[1,2],"prompt_messages":[{"a":1}]}`),
	}
	for _, l := range accepted {
		var d turnDecoder
		assert.True(t, decodeAgrees(t, &d, l), "declined: %s", l)
	}
	declined := [][]byte{
		line(),                  // no session: Validate refuses it
		line(`"session": ""`),   // the same
		line(`"Session": "s1"`), // encoding/json matches keys without case
		line(fSession, `"prompt_ids": [0, -2147483648]`), // Validate refuses a negative id
		line(fSession, `"group_index": -2`),              // and a negative ordinal
		line(fSession, `"index": -9223372036854775808`),
		line(fSession, `"max_context_tokens": -1`),
		line(`"sess\u0069on": "s"`), // an escaped key
		line(fSession, `"extra": 1`),
		line(fSession, fSession),
		line(fSession, `"index": null`),
		line(fSession, `"index": 1.0`),
		line(fSession, `"index": 1e3`),
		line(fSession, `"index": 9223372036854775808`),
		line(fSession, `"turn": 2147483648`),
		line(fSession, `"prompt_ids": [2147483648]`),
		line(fSession, `"prompt_ids": [1.5]`),
		line(fSession, `"prompt_ids": [01]`),
		line(fSession, `"prompt_ids": null`),
		line(fSession, `"prompt_ids": [1,]`),
		line(fSession, `"output_ids": [1], "output_log_probs": [1e39]`),
		line(fSession, `"output_ids": [1], "output_log_probs": [1, 2]`),
		line(fSession, `"output_ids": [1], "rollout_top_p_token_offsets": [0]`),
		line(fSession, `"prompt_messages": {}`),
		line(fSession, `"prompt_messages": null`),
		line(fSession, `"prompt_messages": [{"a": 01}]`),
		line(fSession, "\"prompt_messages\": [\"\x01\"]"),
		line(fSession, `"prompt_messages": ["\x"]`),
		line(fSession, `"response_message": {"a": tru}`),
		line(fSession, `"ill_formed": null`),
		line(fSession, `"reward": NaN`),
		line(fSession, `"reward": 1e400`),
		[]byte(`{"session": "s"} {"session": "t"}`),
		[]byte(`{"session": "s"}x`),
		[]byte(`["session"]`),
		[]byte(`{"session": "s"`),
	}
	for _, l := range declined {
		var d turnDecoder
		assert.False(t, decodeAgrees(t, &d, l), "accepted: %s", l)
	}
}

// TestTurnDecoderExtends: a line whose arrays extend the previous line's
// reads only what they add, and still agrees with encoding/json; earlier
// turns keep their ids.
func TestTurnDecoderExtends(t *testing.T) {
	seqs := []struct {
		name  string
		lines []string
	}{
		{"ids grow", []string{`"prompt_ids": [1, 2, 3]`, `"prompt_ids": [1, 2, 3, 4, 5]`, `"prompt_ids": [1, 2, 3, 4, 5]`, `"prompt_ids": [1, 2, 3, 4, 5 , 6 ]`}},
		{"ids: the last id grows", []string{`"prompt_ids": [1, 2, 3]`, `"prompt_ids": [1, 2, 34]`, `"prompt_ids": [1, 2, 34.5]`}},
		{"ids drift", []string{`"prompt_ids": [1, 2, 3]`, `"prompt_ids": [1, 9, 3, 4]`, `"prompt_ids": [1, 9, 3, 4, 5]`}},
		{"ids: bad tail", []string{`"prompt_ids": [1, 2]`, `"prompt_ids": [1, 2,]`, `"prompt_ids": [1, 2, x]`, `"prompt_ids": [1, 2 3]`, `"prompt_ids": [1, 2, 3]`}},
		{"ids from empty", []string{`"prompt_ids": []`, `"prompt_ids": [1]`, `"prompt_ids": [1, 2]`}},
		{"messages grow", []string{`"prompt_messages": [{"role": "user"}]`, `"prompt_messages": [{"role": "user"}, {"role": "tool", "content": "t"}]`,
			`"prompt_messages": [{"role": "user"}, {"role": "tool", "content": "t"} ]`}},
		{"messages: the last scalar grows", []string{`"prompt_messages": [{}, 1]`, `"prompt_messages": [{}, 12]`, `"prompt_messages": [{}, 12, tru]`, `"prompt_messages": [{}, 12, true]`}},
		{"messages: bad tail", []string{`"prompt_messages": [{"a": 1}]`, `"prompt_messages": [{"a": 1},]`, `"prompt_messages": [{"a": 1}, {"b": }]`, "\"prompt_messages\": [{\"a\": 1}, \"\x02\"]"}},
	}
	for _, seq := range seqs {
		t.Run(seq.name, func(t *testing.T) {
			var d turnDecoder
			var kept [][]int32
			var wants [][]int32
			for _, f := range seq.lines {
				l := line(fSession, f)
				if decodeAgrees(t, &d, l) {
					tr, _, _ := d.decode(l) // decode again: the previous line is now itself
					want, err := decodeTurnJSON(l, map[string]int32{})
					require.NoError(t, err)
					require.Equal(t, want.PromptIDs, tr.PromptIDs)
					kept, wants = append(kept, tr.PromptIDs), append(wants, want.PromptIDs)
				}
			}
			for i := range kept {
				assert.Equal(t, wants[i], kept[i], "turn %d's ids are its own", i)
			}
		})
	}
}

// TestTurnDecoderBenchLines: every line of the benchmark's generated file
// (the shape of other systems' dumps) takes the fast path and agrees.
func TestTurnDecoderBenchLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turns.jsonl")
	n, err := writeBenchTurns(path, 1, 3)
	require.NoError(t, err)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	var d turnDecoder
	for i := 0; i < n; i++ {
		l, err := br.ReadBytes('\n')
		require.NoError(t, err)
		require.True(t, decodeAgrees(t, &d, l), "line %d declined", i+1)
	}
}

// FuzzTurnLines decodes two lines in turn (the second may extend the first's
// arrays) and holds both to encoding/json.
func FuzzTurnLines(f *testing.F) {
	f.Add(line(fSession, fPrompt, fMsgs), line(fSession, `"prompt_ids": [1, 2, 3, 4]`, `"prompt_messages": [{"role": "user", "content": "u"}, {"role": "tool"}]`))
	f.Add(line(fSession, fPrompt, fOutput, fLPs, fMsgs, fResp, `"turn": 1, "index": 2`), line(fSession, `"prompt_ids": [1, 2, 34]`))
	f.Add(line(fSession, `"prompt_messages": [{}, 1]`), line(fSession, `"prompt_messages": [{}, 12]`))
	f.Add(line(fSession, `"output_ids": [1, 2], "rollout_top_p_token_offsets": [0, 1, 3], "rollout_top_p_token_ids": [1, 2, 3]`),
		line(fSession, `"reward": 0.5, "started_ms": 5, "ill_formed": true, "finish_reason": "stop"`))
	f.Add(line(`"Session": "s"`), line(fSession, `"index": 1.0`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var d turnDecoder
		decodeAgrees(t, &d, a)
		decodeAgrees(t, &d, b)
	})
}

// readTurnsJSONLReference is readTurnsJSONL with every line read by
// encoding/json: the reference the fast path is held to.
func readTurnsJSONLReference(data []byte, name string) ([]records.Turn, error) {
	var out []records.Turn
	order := map[string]int32{}
	for lineNo, line := range bytes.SplitAfter(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		t, err := decodeTurnJSON(line, order)
		if err == nil {
			err = checkTurnFields(t)
		}
		if err != nil {
			return out, stagecmd.BadInputError{Err: fmt.Errorf("%s:%d: %w", name, lineNo+1, err)}
		}
		order[t.Session]++
		out = append(out, t)
	}
	return out, nil
}

// TestReadTurnsJSONLAgrees: over a file of generated agent sessions with
// lines the fast path declines spliced in (valid ones, and one malformed
// line in each variant), readTurnsJSONL makes the turns, and fails with the
// error, that encoding/json's reading does.
func TestReadTurnsJSONLAgrees(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turns.jsonl")
	_, err := writeBenchTurns(path, 1, 5)
	require.NoError(t, err)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	// Valid lines the fast path declines: a key in another case, a null
	// for a non-pointer field, a key with an escape.
	declined := func(l []byte) []byte {
		l = bytes.Replace(l, []byte(`"index": `), []byte(`"Index": `), 1)
		l = bytes.Replace(l, []byte(`"max_context_tokens": 32768`), []byte(`"max_context_tokens": null, "ill_formed": null`), 1)
		return bytes.Replace(l, []byte(`"reward": `), []byte(`"rew\u0061rd": `), 1)
	}
	for _, k := range []int{0, 1, 7, 8, 60, 90} {
		lines[k] = declined(lines[k])
	}
	valid := bytes.Join(lines, nil)
	valid = append(valid, "\n  \n"...) // blank lines are skipped

	for _, c := range []struct {
		name string
		bad  []byte // replaces line 31, if set
	}{
		{"valid", nil},
		{"syntax", []byte(`{"session": "s", "prompt_ids": [1, 2}` + "\n")},
		{"unknown field", []byte(`{"session": "s", "extra": 1}` + "\n")},
		{"type", []byte(`{"session": "s", "prompt_ids": [1.5]}` + "\n")},
		{"range", []byte(`{"session": "s", "prompt_ids": [2147483648]}` + "\n")},
		{"validate", []byte(`{"session": "s", "output_ids": [1], "output_log_probs": [1, 2]}` + "\n")},
		{"prompt_messages", []byte(`{"session": "s", "prompt_messages": {"role": "user"}}` + "\n")},
		{"no session", []byte(`{"index": 1}` + "\n")},
		{"truncated", lines[30][:len(lines[30])/2]},
		{"extends, then breaks", bytes.Replace(lines[30], []byte(`], "output_ids"`), []byte(`, 1e5], "output_ids"`), 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			input := valid
			if c.bad != nil {
				in := append([][]byte(nil), lines...)
				in[30] = c.bad
				input = bytes.Join(in, nil)
			}
			want, wantErr := readTurnsJSONLReference(input, "turns.jsonl")
			var got []records.Turn
			err := readTurnsJSONL(bytes.NewReader(input), "turns.jsonl", func(t records.Turn) error {
				got = append(got, t)
				return nil
			})
			if wantErr != nil {
				require.Error(t, err)
				assert.Equal(t, wantErr.Error(), err.Error())
				assert.ErrorAs(t, err, new(stagecmd.BadInputError), "a bad line is bad input")
				assert.Contains(t, err.Error(), "turns.jsonl:31: ")
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, len(want), len(got))
			for i := range want {
				require.True(t, reflect.DeepEqual(want[i], got[i]), "turn %d:\n got %+v\nwant %+v", i, got[i], want[i])
			}
		})
	}
}

// TestLineReader holds lineReader to bufio.Reader.ReadBytes('\n') over
// inputs and readers of every shape (short reads, data with the error,
// an error before the end, chunks smaller than a line), and checks that
// no line returned is written afterwards.
func TestLineReader(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	inputs := []string{"", "\n", "a", "a\n", "a\nb", "a\nb\n", "\n\n\nx", strings.Repeat("long line ", 100) + "\nshort\n"}
	for range 60 {
		var sb strings.Builder
		for n := rng.IntN(8); n > 0; n-- {
			sb.WriteString(strings.Repeat("x", rng.IntN(40)))
			if rng.IntN(4) > 0 {
				sb.WriteByte('\n')
			}
		}
		inputs = append(inputs, sb.String())
	}
	failing := errors.New("disk on fire")
	readers := []struct {
		name string
		make func(string) io.Reader
	}{
		{"plain", func(s string) io.Reader { return strings.NewReader(s) }},
		{"one byte", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
		{"half", func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) }},
		{"data with EOF", func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) }},
		{"error", func(s string) io.Reader { return io.MultiReader(strings.NewReader(s), iotest.ErrReader(failing)) }},
	}
	type result struct {
		lines []string
		err   error
	}
	for _, in := range inputs {
		for _, rd := range readers {
			var want result
			br := bufio.NewReader(rd.make(in))
			for {
				l, err := br.ReadBytes('\n')
				want.lines = append(want.lines, string(l))
				if err != nil {
					want.err = err
					break
				}
			}
			for _, chunk := range []int{1, 3, 16, 4 << 20} {
				lr := lineReader{r: rd.make(in), chunk: chunk}
				var got result
				var held [][]byte
				for {
					l, err := lr.next()
					got.lines, held = append(got.lines, string(l)), append(held, l)
					if err != nil {
						got.err = err
						break
					}
				}
				require.Equal(t, want, got, "%q, %s reader, chunk %d", in, rd.name, chunk)
				for i, l := range held {
					require.Equal(t, got.lines[i], string(l), "line %d was written after it was returned", i)
				}
			}
		}
	}
}
