package convert_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/datasets"
)

// commands are kiln-convert's subcommands beside kiln's dataset commands,
// so tests convert and export in one in-process app.
func commands(env *stagecmd.Env) []*cli.Command {
	return append(convert.Commands(env), datasets.Commands(env)...)
}

func run(t *testing.T, args ...string) stagetest.Result {
	t.Helper()
	return stagetest.Run(t, commands, args...)
}

// mimoRow is a code.parquet row shaped like MiMo's: a struct column
// extra_info holding instance_json, plus a column convert ignores.
type mimoRow struct {
	DataSource string     `parquet:"data_source"`
	ExtraInfo  *extraInfo `parquet:"extra_info,optional"`
}

type extraInfo struct {
	Index        int64   `parquet:"index"`
	InstanceJSON *string `parquet:"instance_json,optional"`
}

// instance is an instance_json object; nil fields are left out.
type instance map[string]any

// basic returns a valid instance (docs/data-and-grading.md §6 case 1) with id.
func basic(id string) instance {
	return instance{
		"instance_id": id, "problem_statement": "Fix the widget.", "docker_image": "example.invalid/mimo:" + id,
		"cwd": "/testbed", "test_patch": t1, "test_command": "bash /testbed/mimo_test_command.sh",
	}
}

// t1 is the docs/data-and-grading.md §6 test patch T1.
const t1 = "diff --git a/tests/test_x.py b/tests/test_x.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_x.py\n@@ -0,0 +1 @@\n+assert True\n"

func mappingLine(id string) string {
	b, _ := json.Marshal(map[string]string{"dataset_image": "example.invalid/mimo:" + id, "dockerhub_image": "docker.io/xiaomimimo/mimo-v2.6-rl-oss:" + id})
	return string(b) + "\n"
}

// writeMiMo writes DIR/code.parquet with one row per instance (a nil
// instance is a null instance_json; the string "NULL-EXTRA" a null
// extra_info) and DIR/image-mapping.jsonl as given.
func writeMiMo(t *testing.T, rows []any, mapping string) string {
	t.Helper()
	dir := t.TempDir()
	var out []mimoRow
	for i, r := range rows {
		row := mimoRow{DataSource: "mimo"}
		switch v := r.(type) {
		case nil:
			row.ExtraInfo = &extraInfo{Index: int64(i)}
		case string:
			if v != "NULL-EXTRA" {
				row.ExtraInfo = &extraInfo{Index: int64(i), InstanceJSON: &v}
			}
		case instance:
			b, err := json.Marshal(v)
			require.NoError(t, err)
			s := string(b)
			row.ExtraInfo = &extraInfo{Index: int64(i), InstanceJSON: &s}
		default:
			t.Fatalf("row %d: %T", i, r)
		}
		out = append(out, row)
	}
	writeParquet(t, filepath.Join(dir, "code.parquet"), out)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "image-mapping.jsonl"), []byte(mapping), 0o644))
	return dir
}

func writeParquet[T any](t *testing.T, path string, rows []T) {
	t.Helper()
	var b bytes.Buffer
	w := parquet.NewGenericWriter[T](&b, parquet.MaxRowsPerRowGroup(2))
	_, err := w.Write(rows)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
}

// export returns a version's rows as kiln export writes them.
func export(t *testing.T, storeDir, ref string) []map[string]any {
	t.Helper()
	return parseLines(t, exportRaw(t, storeDir, ref))
}

// exportRaw is kiln export's output.
func exportRaw(t *testing.T, storeDir, ref string) string {
	t.Helper()
	res := run(t, "export", "--store", storeDir, "--format", "jsonl", ref)
	require.Equal(t, 0, res.Code, res.Stderr)
	return res.Stdout
}

// keyOrder lists an object's keys in order, and those of its "metadata".
func keyOrder(t *testing.T, line string) []string {
	t.Helper()
	var keys []string
	var walk func(dec *json.Decoder, prefix string)
	walk = func(dec *json.Decoder, prefix string) {
		_, err := dec.Token() // {
		require.NoError(t, err)
		for dec.More() {
			tok, err := dec.Token()
			require.NoError(t, err)
			k := tok.(string)
			keys = append(keys, prefix+k)
			if prefix == "" && k == "metadata" {
				walk(dec, "metadata.")
				continue
			}
			var skip json.RawMessage
			require.NoError(t, dec.Decode(&skip))
		}
		_, err = dec.Token() // }
		require.NoError(t, err)
	}
	walk(json.NewDecoder(strings.NewReader(line)), "")
	return keys
}

func parseLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<26)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var v map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &v), sc.Text())
		out = append(out, v)
	}
	return out
}

// readTasks returns a version's task rows.
func readTasks(t *testing.T, storeDir, ref string) []records.Task {
	t.Helper()
	st, err := store.NewLocal(storeDir)
	require.NoError(t, err)
	v, err := dataset.OpenString(context.Background(), st, ref)
	require.NoError(t, err)
	var tasks []records.Task
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachTask(data, func(task records.Task) error {
			tasks = append(tasks, task)
			return nil
		})
	}))
	return tasks
}

// manifest opens a version's manifest.
func manifest(t *testing.T, storeDir, ref string) *dataset.Version {
	t.Helper()
	st, err := store.NewLocal(storeDir)
	require.NoError(t, err)
	v, err := dataset.OpenString(context.Background(), st, ref)
	require.NoError(t, err)
	return v
}

// noVersions asserts the store holds no committed version of any dataset.
func noVersions(t *testing.T, storeDir string) {
	t.Helper()
	st, err := store.NewLocal(storeDir)
	require.NoError(t, err)
	list, err := dataset.List(context.Background(), st, "")
	require.NoError(t, err)
	require.Empty(t, list, "a version was committed")
}
