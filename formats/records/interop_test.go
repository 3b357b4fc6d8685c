package records_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/testenv"
)

// Kiln's files must be readable by implementations that share no code with
// it. TestIndependentReaders writes shards with kiln's encoders and reads
// them back with DuckDB (Parquet) and Apache Arrow JS (Arrow IPC), through
// the Node scripts in testdata/interop. Node and the npm packages are set up
// by scripts/install-test-deps.sh.

const interopHint = "run scripts/install-test-deps.sh"

// interopPackages must all be installed in the npm directory.
var interopPackages = []string{"@duckdb/node-api", "apache-arrow", "fzstd"}

// interopNPMDir finds the npm directory of the interop scripts: $KILN_NPM_DIR,
// else the one named in ~/.cache/kiln/npm-current. When it or node is
// missing the test is skipped, or fails when CI=true.
func interopNPMDir(t *testing.T) string {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		testenv.SkipOrFail(t, "%s; %s", fmt.Sprintf(format, args...), interopHint)
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node is not in PATH")
		return ""
	}
	dir := os.Getenv("KILN_NPM_DIR")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			missing("no home directory: %v", err)
			return ""
		}
		current, err := os.ReadFile(filepath.Join(home, ".cache", "kiln", "npm-current"))
		if err != nil {
			missing("no npm directory for the interop tests (%v)", err)
			return ""
		}
		dir = strings.TrimSpace(string(current))
		// The install script writes this marker last: without it the
		// install was interrupted.
		if _, err := os.Stat(filepath.Join(dir, ".kiln-complete")); err != nil {
			missing("npm directory %s is incomplete", dir)
			return ""
		}
	}
	for _, pkg := range interopPackages {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			missing("npm package %s is not installed in %s", pkg, dir)
			return ""
		}
	}
	return dir
}

// runNode runs one of the testdata/interop scripts and returns its stdout.
func runNode(t *testing.T, npmDir, script string, args ...string) []byte {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("testdata", "interop", script))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{path}, args...)...)
	cmd.Env = append(os.Environ(), "KILN_NPM_DIR="+npmDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "node %s failed:\n%s", script, stderr.String())
	return out
}

func ptr[T any](v T) *T { return &v }

func TestIndependentReaders(t *testing.T) {
	npmDir := interopNPMDir(t)
	dir := t.TempDir()
	t.Run("tasks/duckdb", func(t *testing.T) { testTasksDuckDB(t, npmDir, dir) })
	t.Run("trajectories/arrow-js", func(t *testing.T) { testTrajectoriesArrowJS(t, npmDir, dir) })
}

func interopTasks() []records.Task {
	return []records.Task{{
		TaskID:           "interop-000",
		TaskIndex:        0,
		Dataset:          ptr("kiln-interop"),
		Split:            ptr("train"),
		Repo:             ptr("octo/ütf-8"),
		Prompt:           `[{"role":"user","content":"Répare le bug — 修复这个错误 🐛"}]`,
		ProblemStatement: ptr("naïve café: ✓ ≠ ✗"),
		Image:            ptr("ghcr.io/kiln/interop:1"),
		Workdir:          ptr("/testbed"),
		EvalUser:         ptr("root"),
		PreCommands:      ptr(`["pip install -e ."]`),
		Grading:          ptr(`{"kind":"eval_cmd","eval_cmd":"pytest -q tests/"}`),
		Agent:            ptr("mini-swe-agent"),
		Metadata:         `{"instance_id":"interop-000","lang":"日本語"}`,
		Label:            ptr(`"interop-000"`),
		Extra:            ptr(`{"difficulty":"hard"}`),
	}, {
		// Every nullable column nil.
		TaskID:    "interop-001",
		TaskIndex: 1,
		Prompt:    `[{"role":"system","content":"Ты — помощник"},{"role":"user","content":"مرحبا بالعالم"}]`,
		Metadata:  `{"lang":"ελληνικά"}`,
	}, {
		TaskID:    "interop-002",
		TaskIndex: 2,
		Dataset:   ptr("kiln-interop"),
		Prompt:    `"a plain string prompt 🚀"`,
		Workdir:   ptr("/work/dir with spaces"),
		Metadata:  `{}`,
	}}
}

type duckdbTasks struct {
	Count          int64   `json:"count"`
	TaskIndex      []int64 `json:"task_index"`
	DatasetNonNull int64   `json:"dataset_non_null"`
	Columns        []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	} `json:"columns"`
	Rows      []records.Task `json:"rows"`
	JSONProbe []struct {
		MetadataLang   *string `json:"metadata_lang"`
		PromptMessages *int64  `json:"prompt_messages"`
	} `json:"json_probe"`
	Codecs []string `json:"codecs"` // column chunk compression, from parquet_metadata
}

func testTasksDuckDB(t *testing.T, npmDir, dir string) {
	tasks := interopTasks()
	file := filepath.Join(dir, "tasks.parquet")
	f, err := os.Create(file)
	require.NoError(t, err)
	enc := records.NewTaskEncoder(f)
	require.NoError(t, enc.Write(tasks...))
	require.NoError(t, enc.Close())
	require.NoError(t, f.Close())

	out := runNode(t, npmDir, "duckdb_tasks.cjs", file)
	var got duckdbTasks
	require.NoError(t, json.Unmarshal(out, &got), "duckdb output: %s", out)

	assert.Equal(t, int64(len(tasks)), got.Count)
	assert.Equal(t, []int64{0, 1, 2}, got.TaskIndex)
	assert.Equal(t, int64(2), got.DatasetNonNull, "count(dataset) skips the NULL")
	assert.Equal(t, []string{"ZSTD"}, got.Codecs, "DuckDB decoded zstd column chunks")

	var wantCols []string
	for _, fld := range parquet.SchemaOf(records.Task{}).Fields() {
		wantCols = append(wantCols, fld.Name())
	}
	var gotCols []string
	for _, c := range got.Columns {
		gotCols = append(gotCols, c.Name)
		want := "VARCHAR"
		if c.Name == "task_index" {
			want = "BIGINT"
		}
		assert.Equal(t, want, c.Type, "DuckDB type of column %s", c.Name)
	}
	assert.Equal(t, wantCols, gotCols)

	require.Len(t, got.Rows, len(tasks))
	assert.Equal(t, "interop-000", got.Rows[0].TaskID)
	assert.Nil(t, got.Rows[1].Dataset, "NULL dataset")
	assert.Nil(t, got.Rows[1].Grading, "NULL grading")
	assert.Equal(t, "ghcr.io/kiln/interop:1", *got.Rows[0].Image)
	assert.Equal(t, `[{"role":"user","content":"Répare le bug — 修复这个错误 🐛"}]`, got.Rows[0].Prompt)
	// Every column of every row, NULLs included, as written.
	assert.Equal(t, tasks, got.Rows)

	require.Len(t, got.JSONProbe, len(tasks))
	assert.Equal(t, ptr("日本語"), got.JSONProbe[0].MetadataLang)
	assert.Equal(t, ptr("ελληνικά"), got.JSONProbe[1].MetadataLang)
	assert.Nil(t, got.JSONProbe[2].MetadataLang)
	assert.Equal(t, ptr(int64(1)), got.JSONProbe[0].PromptMessages)
	assert.Equal(t, ptr(int64(2)), got.JSONProbe[1].PromptMessages)
}

func interopTrajectories() []records.Trajectory {
	const base = int64(1) << 40 // rollout ids beyond 32 bits
	return []records.Trajectory{{
		RolloutID: base + 1, Index: 0, GroupIndex: 0, Segment: 0,
		Tokens:          []int32{151644, 872, 198, 9707, 0, 2147483647, 13, 151645},
		ResponseLength:  3,
		LossMask:        []uint8{1, 0, 1},
		RolloutLogProbs: []float32{-0.125, -2.3456789, 0},
	}, {
		RolloutID: base + 2, Index: 1, GroupIndex: 1, Segment: 1,
		Tokens:          []int32{151644, 872, 198, 40, 1079, 264, 1273, 13, 151645, 77091, 198, 33975},
		ResponseLength:  4,
		LossMask:        []uint8{1, 1, 0, 1},
		RolloutLogProbs: []float32{-0.6931472, -15.25, -3.3333333, -1e-4},
		Truncated:       true,
		UseTool:         true,
		Reward:          ptr(0.875),
		Replay: records.Replay{
			TopPTokenOffsets:   []int32{0, 2, 3, 3, 5},
			TopPTokenIDs:       []int32{10, 11, 12, 13, 14},
			TopPLogProbs:       []float32{-0.1, -2.4, -0.01, -0.5, -0.9},
			TopK:               2,
			TopKTokenIDs:       []int32{1, 2, 3, 4, 5, 6, 7, 8},
			TopKLogProbs:       []float32{-0.2, -1.8, -0.3, -1.5, -0.05, -3.25, -0.7, -0.75},
			RoutedExperts:      []int32{0, 7, 3, 5, 1, 6, 2, 4, 63, 62, 61, 60, 8, 9, 10, 11},
			RoutedExpertsShape: []int32{4, 2, 2},
		},
	}, {
		RolloutID: base + 2, Index: 1, GroupIndex: 1, Segment: 2,
		Tokens:          []int32{151644, 77091, 198, 2, 3, 151645},
		ResponseLength:  2,
		LossMask:        []uint8{0, 1},
		RolloutLogProbs: []float32{-0.5, -1.5},
		IllFormed:       true,
	}}
}

// arrowJSFile is what arrow_trajectories.cjs prints for one file.
type arrowJSFile struct {
	File       string `json:"file"`
	NumRows    int    `json:"numRows"`
	Batches    int    `json:"batches"`
	ZstdFrames int    `json:"zstdFrames"`
	Fields     []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		Nullable bool   `json:"nullable"`
	} `json:"fields"`
	Rows []struct {
		RolloutID          int64     `json:"rollout_id"`
		Index              int64     `json:"index"`
		GroupIndex         int64     `json:"group_index"`
		Segment            int32     `json:"segment"`
		Tokens             []int32   `json:"tokens"`
		ResponseLength     int32     `json:"response_length"`
		LossMask           []int     `json:"loss_mask"`
		RolloutLogProbs    []float64 `json:"rollout_log_probs"`
		Truncated          bool      `json:"truncated"`
		UseTool            bool      `json:"use_tool"`
		IllFormed          bool      `json:"ill_formed"`
		Reward             *float64  `json:"reward"`
		TopPTokenIDs       []int32   `json:"rollout_top_p_token_ids"`
		TopPTokenOffsets   []int32   `json:"rollout_top_p_token_offsets"`
		TopPLogProbs       []float64 `json:"rollout_top_p_log_probs"`
		TopKTokenIDs       []int32   `json:"rollout_topk_token_ids"`
		TopKLogProbs       []float64 `json:"rollout_topk_log_probs"`
		TopK               *int32    `json:"rollout_topk_k"`
		RoutedExperts      []int32   `json:"rollout_routed_experts"`
		RoutedExpertsShape []int32   `json:"rollout_routed_experts_shape"`
	} `json:"rows"`
}

func testTrajectoriesArrowJS(t *testing.T, npmDir, dir string) {
	segs := interopTrajectories()
	variants := []struct {
		name string
		opts records.ArrowOptions
	}{
		// Small batches so the reader walks more than one record batch.
		{"trajectories-zstd.arrow", records.ArrowOptions{BatchTokens: 10}},
		{"trajectories-plain.arrow", records.ArrowOptions{Uncompressed: true}},
	}
	var files []string
	for _, v := range variants {
		file := filepath.Join(dir, v.name)
		f, err := os.Create(file)
		require.NoError(t, err)
		enc, err := records.NewTrajectoryEncoder(f, v.opts)
		require.NoError(t, err)
		require.NoError(t, enc.Write(segs...))
		require.NoError(t, enc.Close())
		require.NoError(t, f.Close())
		files = append(files, file)
	}

	out := runNode(t, npmDir, "arrow_trajectories.cjs", files...)
	var got []arrowJSFile
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var g arrowJSFile
		require.NoError(t, json.Unmarshal(sc.Bytes(), &g), "arrow-js output: %s", sc.Bytes())
		got = append(got, g)
	}
	require.NoError(t, sc.Err())
	require.Len(t, got, len(variants))

	schema := records.TrajectorySchema()
	for vi, g := range got {
		v := variants[vi]
		t.Run(v.name, func(t *testing.T) {
			assert.Equal(t, v.name, g.File)
			if v.opts.Uncompressed {
				assert.Zero(t, g.ZstdFrames, "plain buffers need no codec")
				assert.Equal(t, 1, g.Batches)
			} else {
				assert.Positive(t, g.ZstdFrames, "buffers went through the zstd codec")
				assert.Greater(t, g.Batches, 1)
			}

			require.Len(t, g.Fields, len(schema.Fields()))
			for i, fld := range schema.Fields() {
				assert.Equal(t, fld.Name, g.Fields[i].Name)
				assert.Equal(t, fld.Nullable, g.Fields[i].Nullable, "nullability of %s", fld.Name)
			}

			require.Equal(t, len(segs), g.NumRows)
			require.Len(t, g.Rows, len(segs))
			assert.Equal(t, segs[0].Tokens, g.Rows[0].Tokens)
			for i, want := range segs {
				r := g.Rows[i]
				msg := fmt.Sprintf("row %d", i)
				assert.Equal(t, want.RolloutID, r.RolloutID, msg)
				assert.Equal(t, want.Index, r.Index, msg)
				assert.Equal(t, want.GroupIndex, r.GroupIndex, msg)
				assert.Equal(t, want.Segment, r.Segment, msg)
				assert.Equal(t, want.Tokens, r.Tokens, msg)
				assert.Equal(t, want.ResponseLength, r.ResponseLength, msg)
				wantMask := make([]int, len(want.LossMask))
				for j, m := range want.LossMask {
					wantMask[j] = int(m)
				}
				assert.Equal(t, wantMask, r.LossMask, msg)
				assertFloats(t, want.RolloutLogProbs, r.RolloutLogProbs, msg+" rollout_log_probs")
				assert.Equal(t, want.Truncated, r.Truncated, msg)
				assert.Equal(t, want.UseTool, r.UseTool, msg)
				assert.Equal(t, want.IllFormed, r.IllFormed, msg)
				if want.Reward == nil {
					assert.Nil(t, r.Reward, msg+" reward")
				} else if assert.NotNil(t, r.Reward, msg+" reward") {
					assert.InDelta(t, *want.Reward, *r.Reward, 1e-6, msg+" reward")
				}
				assert.Equal(t, want.TopPTokenIDs, r.TopPTokenIDs, msg)
				assert.Equal(t, want.TopPTokenOffsets, r.TopPTokenOffsets, msg)
				assertFloats(t, want.TopPLogProbs, r.TopPLogProbs, msg+" top-p logprobs")
				assert.Equal(t, want.TopKTokenIDs, r.TopKTokenIDs, msg)
				assertFloats(t, want.TopKLogProbs, r.TopKLogProbs, msg+" top-k logprobs")
				if want.TopKTokenIDs == nil {
					assert.Nil(t, r.TopK, msg+" top-k k")
				} else if assert.NotNil(t, r.TopK, msg+" top-k k") {
					assert.Equal(t, want.TopK, *r.TopK, msg)
				}
				assert.Equal(t, want.RoutedExperts, r.RoutedExperts, msg)
				assert.Equal(t, want.RoutedExpertsShape, r.RoutedExpertsShape, msg)
			}
		})
	}
}

// assertFloats compares float32 values written with float64 values read,
// within 1e-6; nil (a null list) must stay nil.
func assertFloats(t *testing.T, want []float32, got []float64, msg string) {
	t.Helper()
	if want == nil {
		assert.Nil(t, got, msg)
		return
	}
	if !assert.Len(t, got, len(want), msg) {
		return
	}
	for i := range want {
		assert.InDelta(t, float64(want[i]), got[i], 1e-6, "%s[%d]", msg, i)
	}
}
