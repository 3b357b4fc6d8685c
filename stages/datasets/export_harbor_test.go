package datasets_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/harbor"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// harborRows are reference rows of each grading kind kiln export --format
// harbor writes (the real ones are graded in stages/grade
// TestHarborExportRoundTrip).
const harborRows = `{"prompt": [{"role": "user", "content": "Fix it."}], "label": "mimo-1", "metadata": {"instance_id": "mimo-1", "image": "reg/img:1", "workdir": "/testbed", "problem_statement": "Fix it.", "eval_cmd": "bash -lc 'set -e\ngit apply /tmp/x.patch'", "eval_user": "root", "dataset": "D"}}
{"prompt": "Do it.", "label": "f2p/2", "metadata": {"image": "reg/img:2", "workdir": "/w", "pre_commands": ["pip install x", "echo ok"], "remote_env_info": {"instance_id": "f2p/2", "f2p_script": "import sys\nsys.exit(0)\n"}, "patch": "diff --git a/a b/a\n"}}
`

func TestExportHarbor(t *testing.T) {
	store := t.TempDir()
	in := filepath.Join(t.TempDir(), "rows.jsonl")
	require.NoError(t, os.WriteFile(in, []byte(harborRows), 0o644))
	imp := kiln(t, "import", "tasks", "--store", store, "--out", "tasks/h", in)
	require.Equal(t, 0, imp.Code, imp.Stderr)
	gold := filepath.Join(t.TempDir(), "gold.jsonl")
	require.NoError(t, os.WriteFile(gold, []byte(`{"instance_id": "mimo-1", "model_patch": "diff --git a/m b/m\n"}`+"\n"), 0o644))

	out := filepath.Join(t.TempDir(), "export")
	r := kiln(t, "export", "--store", store, "--format", "harbor", "--solutions", gold, "--out", out, "tasks/h")
	require.Equal(t, 0, r.Code, r.Stderr)
	assert.Equal(t, `{"output": "`+out+`", "tasks": 2}`, r.LastLine())
	assert.Contains(t, r.Stderr, `task "f2p/2" has setup commands (pre_commands)`)

	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(out, p))
		require.NoError(t, err, p)
		return string(b)
	}
	// MiMo: the eval_cmd verbatim, run as its eval_user; the gold patch
	// from --solutions.
	var doc struct {
		SchemaVersion string `toml:"schema_version"`
		Task          struct{ Name string }
		Metadata      map[string]any
		Verifier      struct {
			TimeoutSec float64 `toml:"timeout_sec"`
		}
		Environment struct {
			DockerImage string `toml:"docker_image"`
		}
	}
	_, err := toml.Decode(read("mimo-1/task.toml"), &doc)
	require.NoError(t, err)
	assert.Equal(t, "1.1", doc.SchemaVersion)
	assert.Equal(t, "mimo-1", doc.Task.Name)
	assert.Equal(t, "reg/img:1", doc.Environment.DockerImage)
	assert.Equal(t, 600.0, doc.Verifier.TimeoutSec)
	assert.Equal(t, map[string]any{"workdir": "/testbed", "kiln_task_id": "mimo-1", "kiln_grading_kind": "eval_cmd", "dataset": "D"}, doc.Metadata)
	assert.Equal(t, "Fix it.", read("mimo-1/instruction.md"))
	assert.Equal(t, "bash -lc 'set -e\ngit apply /tmp/x.patch'", read("mimo-1/tests/eval_cmd.sh"))
	assert.Contains(t, read("mimo-1/tests/test.sh"), "kiln_as root bash -c \"$(cat /tests/eval_cmd.sh)\"\n")
	assert.Equal(t, "diff --git a/m b/m\n", read("mimo-1/solution/gold.patch"))
	for _, p := range []string{"mimo-1/tests/test.sh", "mimo-1/solution/solve.sh"} {
		fi, err := os.Stat(filepath.Join(out, p))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o755), fi.Mode().Perm(), p)
	}

	// f2p: an ORG/NAME id in a flat directory, pre_commands kept for kiln,
	// the gold patch from metadata.patch, the instruction from the prompt.
	dir := harbor.ExportDirName("f2p/2")
	assert.Equal(t, "f2p_2", dir)
	doc.Task.Name = ""
	doc.Metadata = nil
	_, err = toml.Decode(read(dir+"/task.toml"), &doc)
	require.NoError(t, err)
	assert.Equal(t, "f2p/2", doc.Task.Name, "ORG/NAME is a Harbor name")
	assert.Equal(t, "f2p/2", doc.Metadata["kiln_task_id"])
	assert.Equal(t, []any{"pip install x", "echo ok"}, doc.Metadata["pre_commands"])
	assert.Equal(t, "Do it.", read(dir+"/instruction.md"))
	assert.Equal(t, "import sys\nsys.exit(0)\n", read(dir+"/tests/f2p.py"))
	assert.Equal(t, "diff --git a/a b/a\n", read(dir+"/solution/gold.patch"))
	// kiln-convert harbor reads the export back (stages/grade grades it).
	c, files, err := harbor.ReadTask(filepath.Join(out, dir))
	require.NoError(t, err)
	assert.True(t, files.HasSolution)
	assert.Empty(t, c.Unknown)

	// Errors: nothing is written.
	ents, _ := os.ReadDir(filepath.Dir(out))
	cases := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"out exists", []string{"--format", "harbor", "--out", out, "tasks/h"}, stagecmd.ExitBadInput, "already exists"},
		{"no out", []string{"--format", "harbor", "tasks/h"}, stagecmd.ExitUsage, "give --out DIR"},
		{"solutions without harbor", []string{"--solutions", gold, "tasks/h"}, stagecmd.ExitUsage, "--solutions is for --format harbor"},
		{"bad solutions", []string{"--format", "harbor", "--solutions", in, "--out", out + "2", "tasks/h"}, stagecmd.ExitBadInput, "want {\"task_id\", \"patch\"}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := kiln(t, append([]string{"export", "--store", store}, c.args...)...)
			assert.Equal(t, c.code, r.Code, r.Stderr)
			assert.Contains(t, r.Stderr, c.msg)
		})
	}
	after, _ := os.ReadDir(filepath.Dir(out))
	assert.Equal(t, len(ents), len(after), "a failed export leaves nothing")
}

// TestExportHarborUngradeable: a task without a grading payload cannot
// be a Harbor task: exit 5 naming it, and no directory.
func TestExportHarborUngradeable(t *testing.T) {
	store := t.TempDir()
	in := filepath.Join(t.TempDir(), "rows.jsonl")
	rows := strings.SplitN(harborRows, "\n", 2)[0] + "\n" + `{"prompt": "x", "label": "bare", "metadata": {"image": "i"}}` + "\n"
	require.NoError(t, os.WriteFile(in, []byte(rows), 0o644))
	imp := kiln(t, "import", "tasks", "--store", store, "--out", "tasks/h", in)
	require.Equal(t, 0, imp.Code, imp.Stderr)
	out := filepath.Join(t.TempDir(), "export")
	r := kiln(t, "export", "--store", store, "--format", "harbor", "--out", out, "tasks/h")
	assert.Equal(t, stagecmd.ExitBadInput, r.Code)
	assert.Contains(t, r.Stderr, `task "bare" has no grading payload`)
	_, err := os.Stat(out)
	assert.True(t, os.IsNotExist(err))
	ents, err := os.ReadDir(filepath.Dir(out))
	require.NoError(t, err)
	assert.Empty(t, ents, "the partial directory is removed")
}
