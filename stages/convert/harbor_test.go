package convert_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/harbor"
)

// harborFixtures is the project's Harbor tasks (fixtures/harbor).
func harborFixtures(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../fixtures/harbor")
	require.NoError(t, err)
	return dir
}

// copyTree copies a fixture task so a test can change it.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	return dst
}

// attachment reads a tasks version's attachment.
func attachment(t *testing.T, storeDir, ref, rel string) []byte {
	t.Helper()
	st, err := store.NewLocal(storeDir)
	require.NoError(t, err)
	v, err := dataset.OpenString(context.Background(), st, ref)
	require.NoError(t, err)
	rc, _, err := v.OpenAttachment(context.Background(), rel)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b
}

func tarNames(t *testing.T, data []byte) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out[h.Name] = h.Mode
	}
}

func TestHarborConvertFixtures(t *testing.T) {
	storeDir := t.TempDir()
	res := run(t, "harbor", "--store", storeDir, harborFixtures(t))
	require.Equal(t, 0, res.Code, res.Stderr)
	ref := res.LastLine()
	require.True(t, strings.HasPrefix(ref, "tasks/harbor@"), ref)

	tasks := readTasks(t, storeDir, ref)
	require.Len(t, tasks, 3)
	byID := map[string]int{}
	for i, tk := range tasks {
		byID[tk.TaskID] = i
		require.EqualValues(t, i, tk.TaskIndex)
	}
	// Directory order; [task].name for schema 1.1, the directory for 1.0.
	require.Equal(t, map[string]int{"kiln-fixtures/calc-fraction": 0, "duration-dockerfile": 1, "slugify-prebuilt": 2}, byID)

	calc := tasks[0]
	ins, err := os.ReadFile(filepath.Join(harborFixtures(t), "calc-fraction", "instruction.md"))
	require.NoError(t, err)
	require.Equal(t, string(ins), *calc.ProblemStatement)
	var prompt []map[string]string
	require.NoError(t, json.Unmarshal([]byte(calc.Prompt), &prompt))
	require.Equal(t, []map[string]string{{"role": "user", "content": string(ins)}}, prompt)
	require.Equal(t, "kiln.local/fixtures:fixture-calc-003", *calc.Image)
	require.Equal(t, "/workspace/repo", *calc.Workdir)
	require.Equal(t, "agent", *calc.EvalUser)
	var g harbor.Grading
	require.NoError(t, json.Unmarshal([]byte(*calc.Grading), &g))
	require.Equal(t, harbor.Kind, g.Kind)
	require.Equal(t, 120.0, g.VerifierTimeoutSec)
	require.Equal(t, map[string]string{"KILN_FIXTURE_ENV": "from-task-toml"}, g.VerifierEnv)
	require.Equal(t, map[string]string{"KILN_FIXTURE_SOLUTION": "yes"}, g.SolutionEnv)
	require.Equal(t, "pass_fraction", g.RewardMetric)
	require.EqualValues(t, 2048, g.MemoryMB, "memory = \"2G\"")

	// tests/ and solution/ are attachments named by their content.
	_, sum, err := harbor.TarDir(filepath.Join(harborFixtures(t), "calc-fraction", "tests"))
	require.NoError(t, err)
	require.Equal(t, harbor.AttachmentPath(sum), g.Tests)
	tests := attachment(t, storeDir, ref, g.Tests)
	require.Equal(t, map[string]int64{"test.sh": 0o755, "test_hidden.py": 0o644}, tarNames(t, tests))
	sol := attachment(t, storeDir, ref, g.Solution)
	require.Contains(t, tarNames(t, sol), "solve.sh")

	// The whole task.toml is in the metadata.
	var md struct {
		Harbor struct {
			Schema   string         `json:"schema"`
			TaskTOML map[string]any `json:"task_toml"`
			Build    *struct {
				Context       string `json:"context"`
				ContextSHA256 string `json:"context_sha256"`
			} `json:"build"`
		} `json:"harbor"`
	}
	require.NoError(t, json.Unmarshal([]byte(calc.Metadata), &md))
	require.Equal(t, "1.1", md.Harbor.Schema)
	require.Equal(t, "Left-associative subtraction in a small calculator", md.Harbor.TaskTOML["task"].(map[string]any)["description"])
	require.Nil(t, md.Harbor.Build)

	// Schema 1.0, prebuilt, verifier user defaulting to root.
	slug := tasks[2]
	require.Equal(t, "root", *slug.EvalUser)
	require.Equal(t, "/testbed", *slug.Workdir)
	require.NoError(t, json.Unmarshal([]byte(slug.Metadata), &md))
	require.Equal(t, "1.0", md.Harbor.Schema)

	// The Dockerfile task: the image is named by the build context.
	dur := tasks[1]
	require.NoError(t, json.Unmarshal([]byte(dur.Metadata), &md))
	require.NotNil(t, md.Harbor.Build)
	require.Equal(t, "kiln.local/harbor-build:"+md.Harbor.Build.ContextSHA256, *dur.Image)
	require.Equal(t, "/testbed", *dur.Workdir, "the Dockerfile's WORKDIR")
	ctxTar := attachment(t, storeDir, ref, md.Harbor.Build.Context)
	require.Contains(t, tarNames(t, ctxTar), "Dockerfile")

	// A rerun finds the version.
	again := run(t, "harbor", "--store", storeDir, harborFixtures(t))
	require.Equal(t, 0, again.Code, again.Stderr)
	require.Equal(t, ref, again.LastLine())

	// One task directory alone is a task; a change to any file of it is a
	// new version.
	one := copyTree(t, filepath.Join(harborFixtures(t), "slugify-prebuilt"))
	r1 := run(t, "harbor", "--store", storeDir, one)
	require.Equal(t, 0, r1.Code, r1.Stderr)
	require.NoError(t, os.WriteFile(filepath.Join(one, "tests", "extra.txt"), []byte("x"), 0o644))
	r2 := run(t, "harbor", "--store", storeDir, one)
	require.Equal(t, 0, r2.Code, r2.Stderr)
	require.NotEqual(t, r1.LastLine(), r2.LastLine())
}

func TestHarborUnknownKeysKept(t *testing.T) {
	dir := copyTree(t, filepath.Join(harborFixtures(t), "slugify-prebuilt"))
	f := filepath.Join(dir, "task.toml")
	b, err := os.ReadFile(f)
	require.NoError(t, err)
	b = append(b, []byte("\n[verifier.extra]\nnetwork_mode = \"public\"\n\n[future_section]\nanswer = 42\n")...)
	require.NoError(t, os.WriteFile(f, b, 0o644))
	storeDir := t.TempDir()
	res := run(t, "harbor", "--store", storeDir, dir)
	require.Equal(t, 0, res.Code, res.Stderr)
	tk := readTasks(t, storeDir, res.LastLine())[0]
	var md struct {
		Harbor struct {
			TaskTOML map[string]any `json:"task_toml"`
			Unknown  []string       `json:"unknown_keys"`
		} `json:"harbor"`
	}
	require.NoError(t, json.Unmarshal([]byte(tk.Metadata), &md))
	require.Equal(t, []string{"verifier.extra.network_mode", "future_section.answer"}, md.Harbor.Unknown)
	require.EqualValues(t, 42, md.Harbor.TaskTOML["future_section"].(map[string]any)["answer"])
}

// A malformed task.toml exits 5 naming the file, the line and the key, and
// commits nothing.
func TestHarborBadTaskTOML(t *testing.T) {
	cases := []struct {
		name, toml, want string
	}{
		{"syntax", "version = \"1.0\"\n[verifier]\ntimeout_sec = = 3\n", `line 3`},
		{"wrong type", "version = \"1.0\"\n\n[verifier]\ntimeout_sec = \"soon\"\n", `line 4 key "verifier.timeout_sec"`},
		{"negative timeout", "version = \"1.0\"\n[agent]\ntimeout_sec = -5.0\n", `line 3 key "agent.timeout_sec": -5: want a positive number of seconds`},
		{"bad memory", "version = \"1.0\"\n[environment]\ndocker_image = \"x\"\nmemory = \"lots\"\n", `line 4 key "environment.memory"`},
		{"bad user", "schema_version = \"1.1\"\n[verifier]\nuser = \"Root Admin\"\n", `line 3 key "verifier.user"`},
		{"schema 2", "schema_version = \"2.0\"\n", `line 1 key "schema_version"`},
		{"bad name", "schema_version = \"1.1\"\n[task]\nname = \"a/b/c\"\n", `line 3 key "task.name"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyTree(t, filepath.Join(harborFixtures(t), "slugify-prebuilt"))
			f := filepath.Join(dir, "task.toml")
			require.NoError(t, os.WriteFile(f, []byte(tc.toml), 0o644))
			storeDir := t.TempDir()
			res := run(t, "harbor", "--store", storeDir, dir)
			require.Equal(t, 5, res.Code, res.Stderr)
			require.Contains(t, res.Stderr, `"`+f+`"`)
			require.Contains(t, res.Stderr, tc.want)
			noVersions(t, storeDir)
		})
	}
}

func TestHarborBadTaskDirs(t *testing.T) {
	storeDir := t.TempDir()
	// No tests/test.sh.
	dir := copyTree(t, filepath.Join(harborFixtures(t), "slugify-prebuilt"))
	require.NoError(t, os.Remove(filepath.Join(dir, "tests", "test.sh")))
	res := run(t, "harbor", "--store", storeDir, dir)
	require.Equal(t, 5, res.Code, res.Stderr)
	require.Contains(t, res.Stderr, "tests/test.sh")
	// No image and no Dockerfile.
	dir = copyTree(t, filepath.Join(harborFixtures(t), "slugify-prebuilt"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "task.toml"), []byte("version = \"1.0\"\n"), 0o644))
	res = run(t, "harbor", "--store", storeDir, dir)
	require.Equal(t, 5, res.Code, res.Stderr)
	require.Contains(t, res.Stderr, "docker_image")
	// A directory without tasks.
	res = run(t, "harbor", "--store", storeDir, t.TempDir())
	require.Equal(t, 5, res.Code, res.Stderr)
	require.Contains(t, res.Stderr, "holds no Harbor task")
	// A compose environment is reported and left out.
	dir = copyTree(t, filepath.Join(harborFixtures(t), "slugify-prebuilt"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "task.toml"), []byte("version = \"1.0\"\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "environment"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "environment", "docker-compose.yaml"), []byte("services: {}\n"), 0o644))
	res = run(t, "harbor", "--store", storeDir, dir)
	require.Equal(t, 5, res.Code, res.Stderr)
	require.Contains(t, res.Stderr, "docker-compose")
	noVersions(t, storeDir)
	res = run(t, "harbor", "--store", storeDir, "--keep-ungradeable", dir)
	require.Equal(t, 0, res.Code, res.Stderr)
	require.Contains(t, res.Stderr, "docker-compose")
}

// TestHarborPreCommands: [metadata].pre_commands (kiln's own key, which
// kiln export --format harbor writes) becomes the task's pre_commands;
// anything but a string or a list of strings is exit 5.
func TestHarborPreCommands(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{`["pip install x", "echo ok"]`, `["pip install x","echo ok"]`},
		{`"echo one"`, `"echo one"`},
		{`42`, ""},
	} {
		dir := copyTree(t, filepath.Join(harborFixtures(t), "slugify-prebuilt"))
		f := filepath.Join(dir, "task.toml")
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		s := strings.Replace(string(b), "[metadata]\n", "[metadata]\npre_commands = "+c.value+"\n", 1)
		require.NotEqual(t, string(b), s, "the fixture has a [metadata] table")
		require.NoError(t, os.WriteFile(f, []byte(s), 0o644))
		storeDir := t.TempDir()
		res := run(t, "harbor", "--store", storeDir, dir)
		if c.want == "" {
			require.Equal(t, 5, res.Code, res.Stderr)
			require.Contains(t, res.Stderr, "[metadata].pre_commands: want a string or a list of strings")
			continue
		}
		require.Equal(t, 0, res.Code, res.Stderr)
		tk := readTasks(t, storeDir, res.LastLine())[0]
		require.NotNil(t, tk.PreCommands)
		require.Equal(t, c.want, *tk.PreCommands)
	}
}
