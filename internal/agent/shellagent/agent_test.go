package shellagent_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/shellagent"
)

const buggy = "package calc\n\nfunc Add(a, b int) int {\n\treturn a - b\n}\n"

// The whole path as the rollout stage runs it: kiln-agent's Main against a
// real adapter over a scripted engine. The model looks at the file with
// bash, fixes it with edit, checks it with bash and answers; the file is
// fixed, every turn is the adapter's record (the session is the API key),
// each prompt after a bare call extends the previous turn's exact tokens
// (the echo is faithful), and the final answer is on stdout.
func TestMainFixesAFileThroughTheAdapter(t *testing.T) {
	s := newStack(t, steps(t,
		step{out: "Let me look.\n" + bash("cat calc.go; pwd")},
		step{out: call("edit", "path", "calc.go", "old_str", "return a - b", "new_str", "return a + b"),
			want: []string{"return a - b", "[exit code 0]"}},
		step{out: bash("grep -c 'a + b' calc.go"), want: []string{"edited calc.go"}},
		step{out: "Fixed: Add now adds.", want: []string{"1\n[exit code 0]"}},
	), adapter.Options{})
	work := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(work, "calc.go"), []byte(buggy), 0o644))
	dir := t.TempDir()
	task := filepath.Join(dir, "task.md")
	require.NoError(t, os.WriteFile(task, []byte("Add subtracts; make it add."), 0o644))
	logPath := filepath.Join(dir, ".harness", "agent.jsonl") // its directory is made
	env := map[string]string{"KILN_AGENT_API_KEY": "sess-1", "KILN_AGENT_BASE_URL": s.url}

	var stdout, stderr bytes.Buffer
	code := shellagent.Main([]string{"--model", "qwen", "--task-file", task, "--workdir", work, "--log", logPath,
		"--temperature", "0.7", "--max-tokens", "512"}, func(k string) string { return env[k] }, &stdout, &stderr)
	require.Equal(t, shellagent.ExitFinal, code, stderr.String())
	assert.Equal(t, "Fixed: Add now adds.\n", stdout.String())
	b, err := os.ReadFile(filepath.Join(work, "calc.go"))
	require.NoError(t, err)
	assert.Equal(t, strings.Replace(buggy, "a - b", "a + b", 1), string(b))

	turns, err := s.ad.Finish("sess-1")
	require.NoError(t, err)
	require.Len(t, turns, 4)
	for i, tr := range turns {
		assert.Equal(t, int32(i), tr.Turn)
		assert.Equal(t, "stop", tr.FinishReason)
		assert.False(t, tr.IllFormed)
		// Turn 1 cannot extend turn 0: Chat Completions does not deliver
		// text beside a call (docs/adapter.md §5.6), so the echoed history
		// differs from the sampled tokens and the adapter renders it anew.
		// Every later turn follows a bare call and reuses it exactly.
		if i > 1 {
			prev := turns[i-1]
			full := append(append([]int32{}, prev.PromptIDs...), prev.OutputIDs...)
			assert.Equal(t, full, tr.PromptIDs[:min(len(full), len(tr.PromptIDs))], "turn %d reuses turn %d's tokens", i, i-1)
		}
	}
	var first []map[string]any
	require.NoError(t, json.Unmarshal([]byte(turns[0].PromptMessages), &first))
	require.Len(t, first, 2)
	assert.Equal(t, "system", first[0]["role"])
	assert.Contains(t, first[0]["content"], "working in the repository at "+work)
	assert.Equal(t, map[string]any{"role": "user", "content": "Add subtracts; make it add."}, first[1])
	assert.Contains(t, turns[1].PromptMessages, work) // pwd ran in the workdir

	// The generate requests carried the client's sampling values.
	var gen struct {
		SamplingParams map[string]any `json:"sampling_params"`
	}
	require.NoError(t, json.Unmarshal(s.eng.RequestsTo("/inference/v1/generate")[0].Body, &gen))
	assert.Equal(t, 0.7, gen.SamplingParams["temperature"])
	assert.Equal(t, float64(512), gen.SamplingParams["max_tokens"])

	lb, err := os.ReadFile(logPath)
	require.NoError(t, err)
	evs := events(t, lb)
	assert.Len(t, ofKind(evs, "assistant"), 4)
	res := toolResults(evs)
	require.Len(t, res, 3)
	assert.Equal(t, float64(0), res[0]["exit_code"])
	assert.Equal(t, "edited calc.go: replaced 1 occurrence", res[1]["output"])
	end := evs[len(evs)-1]
	assert.Equal(t, "end", end["event"])
	assert.Equal(t, "final", end["reason"])
	assert.Equal(t, float64(4), end["turns"])
}

// The loop's stops and tool failures, each against the real adapter.
func TestLoopThroughTheAdapter(t *testing.T) {
	cases := []struct {
		name   string
		script []step
		cfg    shellagent.Config
		ao     adapter.Options
		code   int
		turns  int // recorded by the adapter
		check  func(t *testing.T, res shellagent.Result, evs []map[string]any)
		maxDur time.Duration
	}{{
		name:   "max turns",
		script: []step{{out: bash("echo one")}, {out: bash("echo two"), want: []string{"one"}}, {out: "never asked"}},
		cfg:    shellagent.Config{MaxTurns: 2},
		code:   shellagent.ExitMaxTurns, turns: 2,
		check: func(t *testing.T, res shellagent.Result, evs []map[string]any) {
			assert.Equal(t, "max_turns", res.Reason)
			assert.Len(t, toolResults(evs), 2, "the last turn's calls still run")
		},
	}, {
		name: "unknown tool and missing arguments are error results",
		script: []step{
			{out: call("python", "code", "print(1)")},
			{out: call("bash", "cmd", "ls"), want: []string{`error: unknown tool "python"`}},
			{out: call("edit", "path", "x"), want: []string{`error: bash: the argument "command"`}},
			{out: "gave up", want: []string{`error: edit: the argument "old_str" (a string) is required`}},
		},
		code: shellagent.ExitFinal, turns: 4,
		check: func(t *testing.T, res shellagent.Result, evs []map[string]any) {
			r := toolResults(evs)
			require.Len(t, r, 3)
			for _, x := range r {
				assert.NotEmpty(t, x["error"])
			}
		},
	}, {
		name: "a hanging command is killed at the command timeout and the loop goes on",
		script: []step{
			{out: bash("echo started; sleep 30; echo never")},
			{out: "done", want: []string{"started", "[killed: the command ran past its 300ms timeout]"}},
		},
		cfg:  shellagent.Config{CommandTimeout: 300 * time.Millisecond},
		code: shellagent.ExitFinal, turns: 2, maxDur: 10 * time.Second,
		check: func(t *testing.T, res shellagent.Result, evs []map[string]any) {
			r := toolResults(evs)
			require.Len(t, r, 1)
			assert.Equal(t, true, r[0]["timed_out"])
			assert.Nil(t, r[0]["exit_code"])
		},
	}, {
		name:   "the whole-run timeout kills the command and ends the run",
		script: []step{{out: bash("sleep 30")}, {out: "never asked"}},
		cfg:    shellagent.Config{Timeout: 700 * time.Millisecond},
		code:   shellagent.ExitTimeout, turns: 1, maxDur: 10 * time.Second,
		check: func(t *testing.T, res shellagent.Result, evs []map[string]any) {
			assert.Equal(t, "timeout", res.Reason)
			r := toolResults(evs)
			require.Len(t, r, 1)
			assert.Contains(t, r[0]["output"], "the run's time budget is spent")
		},
	}, {
		name: "output over the limit keeps its head and tail with a note",
		script: []step{
			{out: bash("echo HEAD; i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done; echo TAIL >&2; exit 7")},
			{out: "ok", want: []string{"HEAD", "bytes of output omitted", "TAIL", "[exit code 7]"}},
		},
		cfg:  shellagent.Config{MaxOutputBytes: 256},
		code: shellagent.ExitFinal, turns: 2,
		check: func(t *testing.T, res shellagent.Result, evs []map[string]any) {
			r := toolResults(evs)
			require.Len(t, r, 1)
			assert.Equal(t, true, r[0]["truncated"])
			assert.NotContains(t, r[0]["output"], "line 1000")
			assert.Less(t, len(r[0]["output"].(string)), 256+200)
		},
	}, {
		name:   "a 5xx is retried and then succeeds",
		script: nil, // set below: two engine failures, then the answer
		code:   shellagent.ExitFinal, turns: 1,
		check: func(t *testing.T, res shellagent.Result, evs []map[string]any) {
			errs := ofKind(evs, "model_error")
			require.Len(t, errs, 2)
			for _, e := range errs {
				assert.Equal(t, float64(500), e["status"])
				assert.Equal(t, true, e["retry"])
			}
			assert.Equal(t, "recovered", res.Final)
		},
	}, {
		name:   "a 4xx is not retried",
		script: []step{{out: bash("true")}, {out: "never asked"}},
		ao:     adapter.Options{MaxTurnsPerSession: 1},
		code:   shellagent.ExitError, turns: 1,
		check: func(t *testing.T, res shellagent.Result, evs []map[string]any) {
			errs := ofKind(evs, "model_error")
			require.Len(t, errs, 1)
			assert.Equal(t, float64(429), errs[0]["status"])
			assert.Equal(t, false, errs[0]["retry"])
			assert.ErrorContains(t, res.Err, "HTTP 429")
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			script := steps(t, tc.script...)
			if tc.script == nil {
				script = func(r enginetest.Request) enginetest.Output {
					if r.SessionID == "sid" && r.Turn < 2 {
						return enginetest.Output{Err: assert.AnError}
					}
					return enginetest.Output{Text: "recovered"}
				}
			}
			s := newStack(t, script, tc.ao)
			cfg := tc.cfg
			cfg.BaseURL, cfg.APIKey = s.url, "sid"
			start := time.Now()
			res, evs := run(t, cfg)
			if tc.maxDur > 0 {
				assert.Less(t, time.Since(start), tc.maxDur)
			}
			assert.Equal(t, tc.code, res.ExitCode, "%+v", res)
			turns, err := s.ad.Finish("sid")
			require.NoError(t, err)
			assert.Len(t, turns, tc.turns)
			require.Equal(t, "end", evs[len(evs)-1]["event"])
			assert.Equal(t, float64(tc.code), evs[len(evs)-1]["exit_code"])
			tc.check(t, res, evs)
		})
	}
}
