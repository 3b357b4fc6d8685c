package convert_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// TestBadInput: every bad input fails with exit status 5 and an error that
// names the file, row and instance, and no version is committed.
func TestBadInput(t *testing.T) {
	without := func(in instance, key string) instance {
		out := with(in)
		delete(out, key)
		return out
	}
	ok := mappingLine("A") + mappingLine("B")
	cases := []struct {
		name    string
		rows    []any
		mapping string
		ids     []string
		parquet func(t *testing.T, path string) // replaces code.parquet
		want    []string                        // substrings of the error
	}{
		{name: "null extra_info", rows: []any{basic("A"), "NULL-EXTRA"}, mapping: ok,
			want: []string{`code.parquet" row 2`, "extra_info is null"}},
		{name: "null instance_json", rows: []any{nil}, mapping: ok,
			want: []string{`code.parquet" row 1`, "extra_info.instance_json is null"}},
		{name: "instance_json not an object", rows: []any{"[1]"}, mapping: ok,
			want: []string{`code.parquet" row 1`, "not a JSON object"}},
		{name: "missing test_command", rows: []any{basic("A"), without(basic("B"), "test_command")}, mapping: ok,
			want: []string{`code.parquet" row 2`, `instance "B"`, `required key "test_command" is missing`}},
		{name: "null problem_statement", rows: []any{with(basic("A"), "problem_statement", nil)}, mapping: ok,
			want: []string{`row 1`, `instance "A"`, `required key "problem_statement" is null`}},
		{name: "numeric cwd", rows: []any{with(basic("A"), "cwd", 3)}, mapping: ok,
			want: []string{`row 1`, `instance "A"`, `key "cwd" is a number, want a string`}},
		{name: "empty instance_id", rows: []any{with(basic("A"), "instance_id", "")}, mapping: ok,
			want: []string{`row 1`, `key "instance_id" is empty`}},
		{name: "duplicate id", rows: []any{basic("A"), basic("B"), basic("A")}, mapping: ok,
			want: []string{`code.parquet" row 3`, `instance "A"`, "Duplicate dataset instance ID: A (first at row 1)"}},
		{name: "ids duplicated", rows: []any{basic("A")}, mapping: ok, ids: []string{"B", "A", "B"},
			want: []string{"--ids must not contain duplicate instance IDs (B named more than once)"}},
		{name: "ids not found", rows: []any{basic("A")}, mapping: ok, ids: []string{"Z", "A", "Y"},
			want: []string{"Missing instance IDs: Y, Z"}},
		{name: "image not mapped", rows: []any{basic("A"), basic("C")}, mapping: ok,
			want: []string{`code.parquet" row 2`, `instance "C"`, `image "example.invalid/mimo:C" is not in image-mapping.jsonl`}},
		{name: "patch escapes", rows: []any{with(basic("A"), "test_patch", "diff --git a/../x b/../x\n")}, mapping: ok,
			want: []string{`row 1`, `instance "A"`, "Test patch escapes repository", `path "../x"`}},
		{name: "mapping blank line", rows: []any{basic("A")}, mapping: mappingLine("A") + "\n" + mappingLine("B"),
			want: []string{`image-mapping.jsonl" line 2: blank line`}},
		{name: "mapping bad json", rows: []any{basic("A")}, mapping: mappingLine("A") + mappingLine("B") + "{nope\n",
			want: []string{`image-mapping.jsonl" line 3: not a JSON object`}},
		{name: "mapping key missing", rows: []any{basic("A")}, mapping: `{"dataset_image": "x"}` + "\n",
			want: []string{`image-mapping.jsonl" line 1: key "dockerhub_image" is missing`}},
		{name: "parquet without extra_info", mapping: ok, parquet: func(t *testing.T, path string) {
			type row struct {
				Other string `parquet:"other"`
			}
			writeParquet(t, path, []row{{"x"}})
		}, want: []string{`code.parquet": wrong schema`, `column "extra_info" is missing (the file has other)`}},
		{name: "parquet instance_json not a string", mapping: ok, parquet: func(t *testing.T, path string) {
			type inner struct {
				InstanceJSON int64 `parquet:"instance_json"`
			}
			type row struct {
				ExtraInfo inner `parquet:"extra_info"`
			}
			writeParquet(t, path, []row{{inner{1}}})
		}, want: []string{`column "extra_info.instance_json" is INT64`, "want a string"}},
		{name: "parquet extra_info not a struct", mapping: ok, parquet: func(t *testing.T, path string) {
			type row struct {
				ExtraInfo string `parquet:"extra_info"`
			}
			writeParquet(t, path, []row{{"x"}})
		}, want: []string{`column "extra_info" is`, `want a struct holding "instance_json"`}},
		{name: "not parquet", mapping: ok, parquet: func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("PAR1 nope"), 0o644))
		}, want: []string{`code.parquet" is not a readable Parquet file`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := writeMiMo(t, c.rows, c.mapping)
			if c.parquet != nil {
				c.parquet(t, filepath.Join(data, "code.parquet"))
			}
			storeDir := t.TempDir()
			args := []string{"mimo", "--store", storeDir, "--data", data, "--out", "tasks/bad"}
			for _, id := range c.ids {
				args = append(args, "--ids", id)
			}
			res := run(t, args...)
			require.Equal(t, stagecmd.ExitBadInput, res.Code, "stdout %s\nstderr %s", res.Stdout, res.Stderr)
			for _, w := range c.want {
				assert.Contains(t, res.Stderr, w)
			}
			assert.Empty(t, res.Stdout, "no reference is printed")
			noVersions(t, storeDir)
		})
	}
}

func TestMissingInputIsNotFound(t *testing.T) {
	res := run(t, "mimo", "--store", t.TempDir(), "--data", filepath.Join(t.TempDir(), "nope"), "--out", "tasks/x")
	assert.Equal(t, stagecmd.ExitNotFound, res.Code, res.Stderr)
	assert.Contains(t, res.Stderr, "code.parquet")
}
