package rollout_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/datasets"
	"github.com/kilnrl/kiln/stages/rollout"
)

// kiln runs the kiln-rollout and kiln dataset commands in-process.
func kiln(t *testing.T, args ...string) stagetest.Result {
	t.Helper()
	return stagetest.Run(t, func(env *stagecmd.Env) []*cli.Command {
		return append(rollout.Commands(env), datasets.Commands(env)...)
	}, args...)
}

// msg renders a chat message as JSON.
func msg(role, content string) string {
	b, _ := json.Marshal(map[string]string{"role": role, "content": content})
	return string(b)
}

// sessionTurns is a clean two-turn tool session (docs/assembly.md §6 TV2's shape) for
// agent run i: the second prompt extends the first prompt and output.
func sessionTurns(i int) []records.TurnJSON {
	sys, user := msg("system", "S"), msg("user", fmt.Sprintf("task %d", i))
	call := `{"role":"assistant","content":"call","tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]}`
	tool := msg("tool", "t")
	p0 := []int32{100, 101, 109, 200, int32(1000 + i), 209, 900}
	o1 := []int32{911, 909}
	p1 := append(append(append([]int32{}, p0...), o1...), 300, 311, 309, 900)
	rid := int64(i)
	return []records.TurnJSON{
		{RolloutID: &rid, Index: int64(i), GroupIndex: int64(i / 2), Session: fmt.Sprintf("s%02d", i),
			PromptIDs: p0, OutputIDs: o1, OutputLogProbs: []float32{-0.5, -0.5}, FinishReason: "tool_calls",
			PromptMessages: json.RawMessage("[" + sys + "," + user + "]"), ResponseMessage: json.RawMessage(call), MaxContextTokens: 1000},
		{RolloutID: &rid, Index: int64(i), GroupIndex: int64(i / 2), Session: fmt.Sprintf("s%02d", i),
			PromptIDs: p1, OutputIDs: []int32{912, 909}, OutputLogProbs: []float32{-0.4, -0.4}, FinishReason: "stop",
			PromptMessages:  json.RawMessage("[" + sys + "," + user + "," + call + "," + tool + "]"),
			ResponseMessage: json.RawMessage(msg("assistant", "done")), MaxContextTokens: 1000},
	}
}

func writeJSONL(t *testing.T, turns []records.TurnJSON) string {
	var buf strings.Builder
	for _, tj := range turns {
		buf.WriteString(jsonLine(t, tj) + "\n")
	}
	return writeFile(t, buf.String())
}

func allTurns(n int) []records.TurnJSON {
	var out []records.TurnJSON
	for i := 0; i < n; i++ {
		out = append(out, sessionTurns(i)...)
	}
	return out
}

func exportSorted(t *testing.T, store, ref string) []string {
	r := kiln(t, "export", "--store", store, ref)
	require.Equal(t, 0, r.Code, r.Stderr)
	var rows []string
	sc := bufio.NewScanner(strings.NewReader(r.Stdout))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		rows = append(rows, sc.Text())
	}
	sort.Strings(rows)
	return rows
}

func TestAssembleJSONL(t *testing.T) {
	dir := t.TempDir()
	src := writeJSONL(t, allTurns(6))
	r := kiln(t, "assemble", "--store", dir, "--turns-jsonl", src, "--out", "trajectories/replay")
	require.Equal(t, 0, r.Code, r.Stderr)
	ref := r.LastLine()
	assert.Regexp(t, `^trajectories/replay@[0-9a-f]{20}$`, ref)

	rows := exportSorted(t, dir, ref)
	require.Len(t, rows, 6)
	var seg map[string]any
	require.NoError(t, json.Unmarshal([]byte(rows[0]), &seg))
	for _, field := range []string{"rollout_id", "index", "group_index", "segment", "tokens", "response_length",
		"loss_mask", "rollout_log_probs", "truncated", "use_tool", "ill_formed", "reward"} {
		assert.Contains(t, seg, field)
	}
	assert.JSONEq(t, `{"rollout_id":0,"index":0,"group_index":0,"segment":0,
		"tokens":[100,101,109,200,1000,209,900,911,909,300,311,309,900,912,909],"response_length":8,
		"loss_mask":[1,1,0,0,0,0,1,1],"rollout_log_probs":[-0.5,-0.5,0,0,0,0,-0.4,-0.4],
		"truncated":false,"use_tool":true,"ill_formed":false,"reward":null}`, rows[0])

	v, err := dataset.OpenString(context.Background(), mustLocal(t, dir), ref)
	require.NoError(t, err)
	assert.Equal(t, float64(6), v.Metrics["sessions"])
	assert.Equal(t, float64(24), v.Metrics["trained_tokens"])
	assert.Equal(t, float64(24), v.Metrics["sampled_tokens"])

	// Same input, another store, any split: identical segments.
	for _, split := range []int{1, 2, 3} {
		other := t.TempDir()
		var last string
		for i := 0; i < split; i++ {
			r := kiln(t, "assemble", "--store", other, "--turns-jsonl", src, "--out", "trajectories/replay", "--shard", fmt.Sprintf("%d/%d", i, split))
			require.Equal(t, 0, r.Code, r.Stderr)
			last = r.LastLine()
		}
		assert.Equal(t, ref, last, "the version id does not depend on the split")
		assert.Equal(t, rows, exportSorted(t, other, last), "split %d", split)
	}
}

func mustLocal(t *testing.T, dir string) store.Store {
	st, err := store.NewLocal(dir)
	require.NoError(t, err)
	return st
}

func TestAssembleTurnsDataset(t *testing.T) {
	dir := t.TempDir()
	st := mustLocal(t, dir)
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: "turns/step-0", Kind: records.TurnsKind(),
		Identity: dataset.Identity{Stage: "rollout", CodeVersion: "1"}})
	require.NoError(t, err)
	var turns []records.Turn
	for i, tj := range allTurns(4) {
		tr, err := tj.ToTurn(int32(i % 2))
		require.NoError(t, err)
		turns = append(turns, tr)
	}
	_, err = w.WriteShard(ctx, int64(len(turns)), nil, func(out io.Writer) error {
		enc, err := records.NewTurnEncoder(out, records.ArrowOptions{})
		if err != nil {
			return err
		}
		if err := enc.Write(turns...); err != nil {
			return err
		}
		return enc.Close()
	})
	require.NoError(t, err)
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)

	r := kiln(t, "assemble", "--store", dir, "--turns", "turns/step-0")
	require.Equal(t, 0, r.Code, r.Stderr)
	lg := kiln(t, "log", "--store", dir, r.LastLine())
	assert.Contains(t, lg.Stdout, res.Ref.String())
	fromJSONL := kiln(t, "assemble", "--store", t.TempDir(), "--turns-jsonl", writeJSONL(t, allTurns(4)))
	require.Equal(t, 0, fromJSONL.Code, fromJSONL.Stderr)
	assert.Len(t, exportSorted(t, dir, r.LastLine()), 4)

	sharded := kiln(t, "assemble", "--store", dir, "--turns", "turns/step-0", "--shard", "0/2")
	assert.Equal(t, stagecmd.ExitUsage, sharded.Code)
	assert.Contains(t, sharded.Stderr, "not pinned")
	wrongKind := kiln(t, "assemble", "--store", dir, "--turns", r.LastLine())
	assert.Equal(t, stagecmd.ExitUsage, wrongKind.Code)
	assert.Contains(t, wrongKind.Stderr, "holds trajectories records, not turns")
}

func TestAssembleBadInput(t *testing.T) {
	turns := allTurns(2)
	split := []records.TurnJSON{turns[0], turns[2], turns[1], turns[3]}
	badLP := allTurns(1)
	badLP[0].OutputLogProbs = []float32{-1}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"non-contiguous", []string{"--turns-jsonl", writeJSONL(t, split)}, stagecmd.ExitBadInput, `turns of session "s00" are not contiguous`},
		{"logprob count", []string{"--turns-jsonl", writeJSONL(t, badLP)}, stagecmd.ExitBadInput, "output_log_probs has 1 entries for 2 output ids"},
		{"both inputs", []string{"--turns-jsonl", "x", "--turns", "y"}, stagecmd.ExitUsage, "exactly one of"},
		{"negative T", []string{"--turns-jsonl", "x", "--fork-merge-max-response-tokens", "-1"}, stagecmd.ExitUsage, "must be >= 0"},
		{"missing file", []string{"--turns-jsonl", filepath.Join(t.TempDir(), "none.jsonl")}, stagecmd.ExitNotFound, "none.jsonl"},
		{"empty file", []string{"--turns-jsonl", writeFile(t, "\n\n")}, stagecmd.ExitBadInput, "turns.jsonl: no turns in the file"},
		{"no session", []string{"--turns-jsonl", writeFile(t, `{"index":0,"group_index":0,"prompt_ids":[1],"output_ids":[],"output_log_probs":[]}`+"\n")}, stagecmd.ExitBadInput, `turns.jsonl:1: turn 0 of session "": empty session`},
		{"no prompt ids", []string{"--turns-jsonl", writeFile(t, `{"session":"s","index":0,"group_index":0}`+"\n")}, stagecmd.ExitBadInput, `turns.jsonl:1: field "prompt_ids" is missing`},
		{"trailing garbage", []string{"--turns-jsonl", writeFile(t, jsonLine(t, turns[0])+"}}]garbage\n")}, stagecmd.ExitBadInput, "turns.jsonl:1: text after the turn's object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			r := kiln(t, append([]string{"assemble", "--store", dir}, c.args...)...)
			assert.Equal(t, c.code, r.Code, r.Stderr)
			assert.Contains(t, r.Stderr, c.want)
			all, err := dataset.List(context.Background(), mustLocal(t, dir), "")
			require.NoError(t, err)
			assert.Empty(t, all, "no version after a failure")
		})
	}
}

// writeFile writes text as a turns.jsonl file of its own.
func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "turns.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// jsonLine is one turn as a JSON line's object (without its newline).
func jsonLine(t *testing.T, j records.TurnJSON) string {
	t.Helper()
	b, err := json.Marshal(j)
	require.NoError(t, err)
	return string(b)
}
