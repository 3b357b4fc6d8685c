package convert_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sweRow is a SWE-rebench-style row.
func sweRow(id, repo, parser string) map[string]any {
	return map[string]any{
		"instance_id": id, "repo": repo, "base_commit": "abc123", "problem_statement": "Fix " + id,
		"test_patch":   "diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/tests/test_a.py\n+++ b/tests/test_a.py\n@@ -1 +1 @@\n-x\n+y\n",
		"FAIL_TO_PASS": `["tests/test_a.py::test_one"]`, "PASS_TO_PASS": []string{"tests/test_a.py::test_two"},
		"image": "swerebench/sweb.eval.x86_64." + id, "hints_text": "",
		"install_config": map[string]any{"test_cmd": "pytest -rA", "log_parser": parser, "python": "3.11"},
	}
}

func writeJSONL(t *testing.T, rows []map[string]any) string {
	t.Helper()
	var b strings.Builder
	for _, r := range rows {
		line, err := json.Marshal(r)
		require.NoError(t, err)
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "rows.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	return path
}

// repoRows are 55 rows over 10 repositories of sizes 1..10.
func repoRows() []map[string]any {
	var rows []map[string]any
	for r := 1; r <= 10; r++ {
		for i := 0; i < r; i++ {
			rows = append(rows, sweRow(fmt.Sprintf("org__repo%d-%d", r, i), fmt.Sprintf("org/repo%d", r), "parse_log_pytest"))
		}
	}
	return rows
}

func TestSplitsKeepRepositoriesWhole(t *testing.T) {
	data := writeJSONL(t, repoRows())
	for _, seed := range []string{"0", "1", "7", "12345"} {
		for _, split := range []string{"train=0.7,eval=0.3", "train=0.5,val=0.25,test=0.25", "a=0.95,b=0.05"} {
			t.Run(seed+"/"+split, func(t *testing.T) {
				storeDir := t.TempDir()
				res := run(t, "swebench", "--store", storeDir, "--data", data, "--out", "tasks/swe", "--split", split, "--seed", seed)
				require.Equal(t, 0, res.Code, res.Stderr)
				tasks := readTasks(t, storeDir, res.LastLine())
				require.Len(t, tasks, 55)
				repoSplit := map[string]string{}
				count := map[string]float64{}
				for i, task := range tasks {
					assert.Equal(t, int64(i), task.TaskIndex)
					require.NotNil(t, task.Split)
					if s, ok := repoSplit[*task.Repo]; ok {
						assert.Equal(t, s, *task.Split, "repository %s in two splits", *task.Repo)
					}
					repoSplit[*task.Repo] = *task.Split
					count[*task.Split]++
				}
				for _, part := range strings.Split(split, ",") {
					var name string
					var frac float64
					_, err := fmt.Sscanf(strings.Replace(part, "=", " ", 1), "%s %g", &name, &frac)
					require.NoError(t, err)
					assert.LessOrEqual(t, math.Abs(count[name]-frac*55), 10.0, "split %s: %v tasks, want %v within one unit (10)", name, count[name], frac*55)
				}
			})
		}
	}
}

func TestSplitsOfTasksAreExact(t *testing.T) {
	var rows []any
	mapping := ""
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("task-%02d", i)
		rows = append(rows, basic(id))
		mapping += mappingLine(id)
	}
	data := writeMiMo(t, rows, mapping)
	storeDir := t.TempDir()
	res := run(t, "mimo", "--store", storeDir, "--data", data, "--out", "tasks/m", "--split", "train=0.7,eval=0.3", "--seed", "3")
	require.Equal(t, 0, res.Code, res.Stderr)
	count := map[string]int{}
	for _, task := range readTasks(t, storeDir, res.LastLine()) {
		count[*task.Split]++
	}
	assert.Equal(t, map[string]int{"train": 14, "eval": 6}, count, "a MiMo task is its own unit")
	// The split reaches the export (metadata.split).
	rows2 := export(t, storeDir, res.LastLine())
	assert.Contains(t, []any{"train", "eval"}, rows2[0]["metadata"].(map[string]any)["split"])
}

func TestLimitIsDeterministicAndSpread(t *testing.T) {
	data := writeJSONL(t, repoRows())
	// repoCount: the number of repositories of each split, without --limit.
	repoCount := func(seed string) map[string]int {
		storeDir := t.TempDir()
		res := run(t, "swebench", "--store", storeDir, "--data", data, "--out", "tasks/swe", "--split", "train=0.7,eval=0.3", "--seed", seed)
		require.Equal(t, 0, res.Code, res.Stderr)
		repos := map[string]map[string]bool{}
		for _, task := range readTasks(t, storeDir, res.LastLine()) {
			if repos[*task.Split] == nil {
				repos[*task.Split] = map[string]bool{}
			}
			repos[*task.Split][*task.Repo] = true
		}
		n := map[string]int{}
		for s, r := range repos {
			n[s] = len(r)
		}
		return n
	}
	sample := func(seed string) map[string][]string {
		all := repoCount(seed)
		storeDir := t.TempDir()
		res := run(t, "swebench", "--store", storeDir, "--data", data, "--out", "tasks/swe", "--split", "train=0.7,eval=0.3", "--seed", seed, "--limit", "4")
		require.Equal(t, 0, res.Code, res.Stderr)
		out := map[string][]string{}
		repos := map[string]map[string]bool{}
		for _, task := range readTasks(t, storeDir, res.LastLine()) {
			out[*task.Split] = append(out[*task.Split], task.TaskID)
			if repos[*task.Split] == nil {
				repos[*task.Split] = map[string]bool{}
			}
			repos[*task.Split][*task.Repo] = true
		}
		for s, ids := range out {
			assert.Len(t, ids, 4, "split %s", s)
			// Round-robin: 4 tasks come from min(4, repositories) of them.
			assert.Equal(t, min(4, all[s]), len(repos[s]), "split %s: the sample is spread across repositories", s)
			sort.Strings(ids)
		}
		return out
	}
	a, b := sample("5"), sample("5")
	assert.Equal(t, a, b, "same seed, same sample")
	differs := false
	for _, seed := range []string{"6", "7", "8"} {
		differs = differs || fmt.Sprint(sample(seed)) != fmt.Sprint(a)
	}
	assert.True(t, differs, "other seeds draw other samples")
}

func TestSplitFlagErrors(t *testing.T) {
	data := writeJSONL(t, repoRows())
	for _, split := range []string{"train=0.9", "train=0.5,train=0.5", "train=x", "=1", "train=1.2,eval=-0.2"} {
		res := run(t, "swebench", "--store", t.TempDir(), "--data", data, "--split", split)
		assert.Equal(t, 2, res.Code, "%s: %s", split, res.Stderr)
		assert.Contains(t, res.Stderr, "--split")
	}
}
