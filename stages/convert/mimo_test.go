package convert_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// docs/data-and-grading.md §6 cases 2 and 3: the exact grading commands.
const (
	evalCmdT1    = "bash -lc 'set -e\nif git cat-file -e HEAD:tests/test_x.py 2>/dev/null; then git checkout HEAD -- tests/test_x.py; else git rm -f --cached -- tests/test_x.py >/dev/null 2>&1 || true; rm -f -- tests/test_x.py; fi\nprintf %s ZGlmZiAtLWdpdCBhL3Rlc3RzL3Rlc3RfeC5weSBiL3Rlc3RzL3Rlc3RfeC5weQpuZXcgZmlsZSBtb2RlIDEwMDY0NAotLS0gL2Rldi9udWxsCisrKyBiL3Rlc3RzL3Rlc3RfeC5weQpAQCAtMCwwICsxIEBACithc3NlcnQgVHJ1ZQo= | base64 -d > /tmp/mimo-tests.patch\ngit apply --verbose /tmp/mimo-tests.patch\nbash /testbed/mimo_test_command.sh'"
	evalCmdEmpty = "bash -lc 'set -e\nprintf %s '\"'\"''\"'\"' | base64 -d > /tmp/mimo-tests.patch\ngit apply --verbose /tmp/mimo-tests.patch\necho '\"'\"'hi'\"'\"''"
)

func with(in instance, kv ...any) instance {
	out := instance{}
	for k, v := range in {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// TestSpecConverterCases runs docs/data-and-grading.md §6 cases 1-10 through
// kiln-convert mimo and checks the result through kiln export tasks, as
// equal JSON against golden files (testdata/<name>.jsonl; -update rewrites
// them), and the version's summary metrics.
func TestSpecConverterCases(t *testing.T) {
	cases := []struct {
		name    string
		rows    []any
		mapping string
		ids     []string
		err     string // wanted error text; "" for success
		evalCmd string // when set, the first row's exact eval_cmd
		order   []string
		metrics map[string]any
	}{
		{name: "basic", rows: []any{basic("format-code-task-000001")}, mapping: mappingLine("format-code-task-000001"),
			evalCmd: evalCmdT1, metrics: map[string]any{"tasks": 1.0, "images": 1.0}},
		{name: "quoting", rows: []any{with(basic("q"), "test_patch", "", "test_command", "echo 'hi'")}, mapping: mappingLine("q"),
			evalCmd: evalCmdEmpty},
		{name: "header-quirks", rows: []any{with(basic("h"), "test_patch",
			"diff --git a/old.py b/new.py\ndiff --git a/a b/c.py b/a b/c.py\ndiff --git \"a/x y\" \"b/x y\"\ndiff --git a/same.py b/same.py\n")},
			mapping: mappingLine("h")},
		{name: "escape-absolute", rows: []any{with(basic("e"), "test_patch", "diff --git a//etc/passwd b//etc/passwd\n")}, mapping: mappingLine("e"),
			err: "Test patch escapes repository"},
		{name: "escape-dotdot", rows: []any{with(basic("e"), "test_patch", "diff --git a/x/../../y b/x/../../y\n")}, mapping: mappingLine("e"),
			err: "Test patch escapes repository"},
		{name: "ids-duplicate", rows: []any{basic("A")}, mapping: mappingLine("A"), ids: []string{"A", "A"},
			err: "--ids must not contain duplicate instance IDs"},
		{name: "ids-missing", rows: []any{basic("A")}, mapping: mappingLine("A"), ids: []string{"A", "Z"},
			err: "Missing instance IDs: Z"},
		{name: "ids-order", rows: []any{basic("A"), basic("B")}, mapping: mappingLine("A") + mappingLine("B"), ids: []string{"B", "A"},
			order: []string{"A", "B"}, metrics: map[string]any{"tasks": 2.0, "images": 2.0, "instances": []any{"A", "B"}}},
		{name: "duplicate-selected", rows: []any{basic("A"), basic("A"), basic("B")}, mapping: mappingLine("A") + mappingLine("B"), ids: []string{"A"},
			err: "Duplicate dataset instance ID: A"},
		{name: "duplicate-all", rows: []any{basic("A"), basic("A")}, mapping: mappingLine("A"),
			err: "Duplicate dataset instance ID: A"},
		{name: "duplicate-unselected", rows: []any{basic("A"), basic("A"), basic("B")}, mapping: mappingLine("A") + mappingLine("B"), ids: []string{"B"},
			order: []string{"B"}},
		{name: "mapping-missing", rows: []any{basic("A")}, mapping: mappingLine("B"),
			err: `image "example.invalid/mimo:A" is not in image-mapping.jsonl`},
		{name: "mapping-missing-unselected", rows: []any{basic("A"), basic("B")}, mapping: mappingLine("B"), ids: []string{"B"},
			order: []string{"B"}},
		{name: "empty", rows: nil, mapping: "", err: "No code tasks found"},
		{name: "encoding", rows: []any{with(basic("enc"), "problem_statement", "é<>\x7f")}, mapping: mappingLine("enc"),
			metrics: map[string]any{"tasks": 1.0, "images": 1.0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := writeMiMo(t, c.rows, c.mapping)
			storeDir := t.TempDir()
			args := []string{"mimo", "--store", storeDir, "--data", data, "--out", "tasks/mimo"}
			for _, id := range c.ids {
				args = append(args, "--ids", id)
			}
			res := run(t, args...)
			if c.err != "" {
				require.Equal(t, stagecmd.ExitBadInput, res.Code, res.Stderr)
				assert.Contains(t, res.Stderr, c.err)
				noVersions(t, storeDir)
				return
			}
			require.Equal(t, 0, res.Code, res.Stderr)
			ref := res.LastLine()
			raw := exportRaw(t, storeDir, ref)
			rows := parseLines(t, raw)
			if c.order != nil {
				var got []string
				for _, r := range rows {
					got = append(got, r["label"].(string))
				}
				assert.Equal(t, c.order, got)
			}
			if c.evalCmd != "" {
				assert.Equal(t, c.evalCmd, rows[0]["metadata"].(map[string]any)["eval_cmd"])
			}
			for k, v := range c.metrics {
				assert.Equal(t, v, jsonRound(manifest(t, storeDir, ref).Metrics)[k], "metric %s", k)
			}
			if c.metrics != nil && c.ids == nil {
				assert.NotContains(t, manifest(t, storeDir, ref).Metrics, "instances")
			}
			golden(t, c.name, raw)
		})
	}
}

// jsonRound gives metrics as JSON would read them back.
func jsonRound(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// golden compares kiln export's output with testdata/<name>.jsonl as equal
// JSON, and the key order of the row and of its metadata (the reference's
// docs/data-and-grading.md §1.5 order: prompt, label, metadata; instance_id, image, workdir,
// problem_statement, eval_cmd, eval_user, dataset).
func golden(t *testing.T, name, raw string) {
	t.Helper()
	path := filepath.Join("testdata", name+".jsonl")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(raw), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -update to create the golden file")
	assert.Equal(t, parseLines(t, string(want)), parseLines(t, raw))
	wantLines, gotLines := strings.Split(strings.TrimSpace(string(want)), "\n"), strings.Split(strings.TrimSpace(raw), "\n")
	require.Len(t, gotLines, len(wantLines))
	for i := range wantLines {
		assert.Equal(t, keyOrder(t, wantLines[i]), keyOrder(t, gotLines[i]), "row %d key order", i)
		assert.Equal(t, []string{"prompt", "label", "metadata", "metadata.instance_id", "metadata.image", "metadata.workdir",
			"metadata.problem_statement", "metadata.eval_cmd", "metadata.eval_user", "metadata.dataset"}, keyOrder(t, gotLines[i]))
	}
}

// TestVersionIdentity: --print-version names the version a run commits; an
// identical rerun finds it; the input's content and the arguments that
// shape the output (not the seed alone, not the order of --ids) select it.
func TestVersionIdentity(t *testing.T) {
	data := writeMiMo(t, []any{basic("A"), basic("B")}, mappingLine("A")+mappingLine("B"))
	storeDir := t.TempDir()
	ref := func(args ...string) string {
		t.Helper()
		res := run(t, append([]string{"mimo", "--store", storeDir, "--data", data, "--out", "tasks/v"}, args...)...)
		require.Equal(t, 0, res.Code, res.Stderr)
		return res.LastLine()
	}
	printed := ref("--print-version")
	noVersions(t, storeDir)
	first := ref()
	assert.Equal(t, printed, first)
	assert.Equal(t, first, ref(), "an identical run finds its version")
	assert.Equal(t, first, ref("--seed", "9"), "the seed alone changes nothing")
	assert.Equal(t, ref("--ids", "A", "--ids", "B"), ref("--ids", "B", "--ids", "A"), "--ids is a set")
	assert.Equal(t, ref("--ids", "A", "--ids", "B"), ref("--ids", "B", "A"), "--ids takes several values, as the reference's")
	assert.NotEqual(t, first, ref("--split", "a=0.5,b=0.5"))
	assert.NotEqual(t, ref("--split", "a=0.5,b=0.5", "--seed", "1"), ref("--split", "a=0.5,b=0.5", "--seed", "2"))
	require.NoError(t, os.WriteFile(filepath.Join(data, "image-mapping.jsonl"), []byte(mappingLine("A")+mappingLine("B")+mappingLine("C")), 0o644))
	assert.NotEqual(t, first, ref(), "changed input content, new version")
}

func TestHelpIsTheManual(t *testing.T) {
	for _, c := range []struct{ cmd, want string }{
		{"mimo", "Test patch escapes repository"},
		{"swebench", "kiln grades by test name"},
		{"swepro", "run_script_path"},
		{"f2p", "f2p_script"},
	} {
		res := run(t, c.cmd, "--help")
		assert.Equal(t, 0, res.Code)
		assert.Contains(t, strings.Join(strings.Fields(res.Stdout), " "), c.want)
		assert.Contains(t, res.Stdout, "EXIT STATUS")
		assert.Contains(t, res.Stdout, "--split")
	}
}

// TestConvertedTasksValidate: MiMo tasks skip records.Task.Validate on the
// hot path because they are valid by construction; this checks that claim
// on rows with quotes, escapes, non-ASCII and control characters.
func TestConvertedTasksValidate(t *testing.T) {
	weird := "quote ' \" \\ \n\t\x01 é 😀 </script> \u2028"
	data := writeMiMo(t, []any{
		with(basic("A"), "problem_statement", weird, "test_command", weird, "extra_key", map[string]any{"n": 1.5, "s": weird}),
		with(basic("B"), "test_patch", "diff --git a/"+weird+" b/x\n"),
	}, mappingLine("A")+mappingLine("B"))
	storeDir := t.TempDir()
	res := run(t, "mimo", "--store", storeDir, "--data", data, "--out", "tasks/v")
	require.Equal(t, 0, res.Code, res.Stderr)
	tasks := readTasks(t, storeDir, res.LastLine())
	require.Len(t, tasks, 2)
	for _, task := range tasks {
		assert.NoError(t, task.Validate())
	}
	assert.Equal(t, weird, *tasks[0].ProblemStatement)
	g := grading(t, tasks[0].Grading)
	assert.Equal(t, map[string]any{"extra_key": map[string]any{"n": 1.5, "s": weird}}, g["other_keys"], "unused keys kept")
	assert.Equal(t, weird, g["test_command"])
}

// TestShardedRun: parts of a --shard run each write their rows and the
// last to finish commits the version, equal to an unsharded run's rows.
func TestShardedRun(t *testing.T) {
	var rows []any
	mapping := ""
	for i := 0; i < 7; i++ {
		id := "task-" + string(rune('a'+i))
		rows = append(rows, basic(id))
		mapping += mappingLine(id)
	}
	data := writeMiMo(t, rows, mapping)
	storeDir := t.TempDir()
	whole := run(t, "mimo", "--store", t.TempDir(), "--data", data, "--out", "tasks/s")
	require.Equal(t, 0, whole.Code, whole.Stderr)
	var ref string
	for i := 0; i < 3; i++ {
		res := run(t, "mimo", "--store", storeDir, "--data", data, "--out", "tasks/s", "--shard", strconv.Itoa(i)+"/3")
		require.Equal(t, 0, res.Code, res.Stderr)
		ref = res.LastLine()
	}
	assert.Equal(t, whole.LastLine(), ref, "sharding does not change the version")
	tasks := readTasks(t, storeDir, ref)
	require.Len(t, tasks, 7)
	sort.Slice(tasks, func(i, j int) bool { return tasks[i].TaskIndex < tasks[j].TaskIndex })
	for i, task := range tasks {
		assert.Equal(t, int64(i), task.TaskIndex)
	}
	assert.Equal(t, 7.0, jsonRound(manifest(t, storeDir, ref).Metrics)["tasks"])
}
