package datasets_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

const referenceRows = "../../formats/records/testdata/reference-rows.jsonl"

// storeCase is a fresh store both as a URI for the CLI (with the
// environment a process needs to reach it) and opened.
type storeCase struct {
	uri string
	env []string
	st  store.Store
}

// eachStore runs f on a fresh local store and a fresh S3 bucket. The S3
// settings are also put in this process's environment for in-process runs.
func eachStore(t *testing.T, f func(t *testing.T, sc storeCase)) {
	t.Run("local", func(t *testing.T) {
		dir := t.TempDir()
		st, err := store.NewLocal(dir)
		require.NoError(t, err)
		f(t, storeCase{uri: dir, st: st})
	})
	t.Run("s3", func(t *testing.T) {
		v := storetest.VersityServer(t)
		for _, kv := range v.Env() {
			k, val, _ := strings.Cut(kv, "=")
			t.Setenv(k, val)
		}
		uri := "s3://" + v.NewBucket(t) + "/data"
		f(t, storeCase{uri: uri, env: v.Env(), st: v.Open(t, uri)})
	})
}

func readLines(t *testing.T, r io.Reader) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var v map[string]any
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&v), sc.Text())
		out = append(out, v)
	}
	return out
}

func TestImportExportRoundTrip(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		printed := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/ref", "--print-version", referenceRows)
		require.Equal(t, 0, printed.Code, printed.Stderr)
		imp := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/ref", referenceRows)
		require.Equal(t, 0, imp.Code, imp.Stderr)
		ref := imp.LastLine()
		assert.Equal(t, printed.LastLine(), ref, "--print-version names the version the run commits")
		assert.Regexp(t, `^tasks/ref@[0-9a-f]{20}$`, ref)

		f, err := os.Open(referenceRows)
		require.NoError(t, err)
		want := readLines(t, f)
		f.Close()
		for _, row := range want { // the documented normalization
			md := row["metadata"].(map[string]any)
			if _, ok := md["instance_id"]; !ok {
				md["instance_id"] = row["label"]
			}
		}

		exp := kiln(t, "export", "--store", sc.uri, "--format", "jsonl", ref)
		require.Equal(t, 0, exp.Code, exp.Stderr)
		assert.Equal(t, want, readLines(t, strings.NewReader(exp.Stdout)))

		out := filepath.Join(t.TempDir(), "tasks.jsonl.zst")
		exp = kiln(t, "export", "--store", sc.uri, "--out", out, "tasks/ref")
		require.Equal(t, 0, exp.Code, exp.Stderr)
		zf, err := os.Open(out)
		require.NoError(t, err)
		defer zf.Close()
		zr, err := zstd.NewReader(zf)
		require.NoError(t, err)
		defer zr.Close()
		assert.Equal(t, want, readLines(t, zr))

		// Re-importing the export gives the same rows again.
		again := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/again", out)
		require.Equal(t, 0, again.Code, again.Stderr)
		exp2 := kiln(t, "export", "--store", sc.uri, again.LastLine())
		assert.Equal(t, want, readLines(t, strings.NewReader(exp2.Stdout)))

		// An identical rerun reports the committed version and writes nothing.
		rerun := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/ref", referenceRows)
		require.Equal(t, 0, rerun.Code)
		assert.Equal(t, ref, rerun.LastLine())
		assert.Contains(t, rerun.Stderr, "already committed")

		ls := kiln(t, "ls", "--store", sc.uri, "tasks/")
		require.Equal(t, 0, ls.Code, ls.Stderr)
		assert.Contains(t, ls.Stdout, strings.TrimPrefix(ref, "tasks/ref@"))
		assert.Contains(t, ls.Stdout, "tasks/again")

		show := kiln(t, "show", "--store", sc.uri, "--rows", "2", "--json", ref)
		require.Equal(t, 0, show.Code, show.Stderr)
		var shown struct {
			Manifest dataset.Manifest
			Rows     []map[string]any
		}
		require.NoError(t, json.Unmarshal([]byte(show.Stdout), &shown))
		assert.Equal(t, int64(4), shown.Manifest.Rows)
		assert.Len(t, shown.Rows, 2)
		assert.Equal(t, "format-code-task-002661", shown.Rows[0]["task_id"])
	})
}

func TestChangedInputFileGetsNewVersion(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "rows.jsonl")
	require.NoError(t, os.WriteFile(src, []byte(`{"prompt": "a", "label": "t1", "metadata": {}}`+"\n"), 0o644))
	first := kiln(t, "import", "tasks", "--store", dir, src)
	require.Equal(t, 0, first.Code, first.Stderr)
	require.NoError(t, os.WriteFile(src, []byte(`{"prompt": "b", "label": "t1", "metadata": {}}`+"\n"), 0o644))
	second := kiln(t, "import", "tasks", "--store", dir, src)
	require.Equal(t, 0, second.Code, second.Stderr)
	assert.NotEqual(t, first.LastLine(), second.LastLine())
	newest := kiln(t, "export", "--store", dir, "tasks")
	assert.Contains(t, newest.Stdout, `"prompt":"b"`)
}

func TestBadInputs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	good := `{"prompt": "p", "label": "a", "metadata": {}}` + "\n"
	storeDir := filepath.Join(dir, "store")
	require.NoError(t, os.MkdirAll(storeDir, 0o755))
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"malformed line", []string{"import", "tasks", "--store", storeDir, write("bad.jsonl", good+`{"prompt": `+"\n")}, stagecmd.ExitBadInput, "bad.jsonl:2: not a JSON object"},
		{"duplicate id", []string{"import", "tasks", "--store", storeDir, write("dup.jsonl", good+good)}, stagecmd.ExitBadInput, `duplicate task id "a" (first on line 1)`},
		{"blank line", []string{"import", "tasks", "--store", storeDir, write("blank.jsonl", good+"\n"+good)}, stagecmd.ExitBadInput, "blank.jsonl:2: empty line"},
		{"empty file", []string{"import", "tasks", "--store", storeDir, write("empty.jsonl", "")}, stagecmd.ExitBadInput, "has no rows"},
		{"missing file", []string{"import", "tasks", "--store", storeDir, filepath.Join(dir, "nope.jsonl")}, stagecmd.ExitNotFound, "nope.jsonl"},
		{"bad shard", []string{"import", "tasks", "--store", storeDir, "--shard", "3/3", write("ok.jsonl", good)}, stagecmd.ExitUsage, `shard "3/3"`},
		{"bad name", []string{"import", "tasks", "--store", storeDir, "--out", "a/_v", write("ok2.jsonl", good)}, stagecmd.ExitUsage, `segment "_v"`},
		{"no ref", []string{"show", "--store", storeDir}, stagecmd.ExitUsage, "want REF"},
		{"unknown dataset", []string{"show", "--store", storeDir, "nope"}, stagecmd.ExitNotFound, "dataset nope: not found"},
		{"bad scheme", []string{"ls", "--store", "ftp://x"}, stagecmd.ExitUsage, "unknown scheme"},
		{"no store", []string{"ls", "--store", filepath.Join(dir, "nostore")}, stagecmd.ExitNotFound, "nostore\" does not exist"},
		{"store is a file", []string{"ls", "--store", write("afile", "")}, stagecmd.ExitUsage, "afile\" is a file, not a directory"},
		{"import into a file", []string{"import", "tasks", "--store", filepath.Join(dir, "afile"), write("ok3.jsonl", good)}, stagecmd.ExitUsage, "afile\" is a file, not a directory"},
		{"malformed ref", []string{"show", "--store", storeDir, "tasks/mimo@ZZZ!"}, stagecmd.ExitUsage, `"tasks/mimo@ZZZ!"`},
		{"malformed log ref", []string{"log", "--store", storeDir, "tasks/../x"}, stagecmd.ExitUsage, `"tasks/../x"`},
		{"bad format", []string{"export", "--store", storeDir, "--format", "csv", "x"}, stagecmd.ExitUsage, `unknown --format "csv"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := kiln(t, c.args...)
			assert.Equal(t, c.code, r.Code, r.Stderr)
			assert.Contains(t, r.Stderr, c.want)
			assert.NotContains(t, r.Stderr, "panic")
		})
	}
	// No failed import left a visible version.
	all, err := dataset.List(context.Background(), mustLocal(t, storeDir), "")
	require.NoError(t, err)
	assert.Empty(t, all)
}

func mustLocal(t *testing.T, dir string) store.Store {
	st, err := store.NewLocal(dir)
	require.NoError(t, err)
	return st
}

func TestLogShowsInputs(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		imp := kiln(t, "import", "tasks", "--store", sc.uri, referenceRows)
		require.Equal(t, 0, imp.Code, imp.Stderr)
		in, err := dataset.ParseRef(imp.LastLine())
		require.NoError(t, err)

		// A derived version, as a later stage would write it.
		w, err := dataset.NewWriter(ctx, sc.st, dataset.Spec{Name: "trajectories/step-0", Kind: records.TrajectoriesKind(),
			Identity: dataset.Identity{Stage: "rollout", CodeVersion: "1", Inputs: []dataset.Ref{in}}})
		require.NoError(t, err)
		_, err = w.WriteShard(ctx, 1, nil, func(out io.Writer) error {
			enc, err := records.NewTrajectoryEncoder(out, records.ArrowOptions{})
			if err != nil {
				return err
			}
			if err := enc.Write(records.Trajectory{Tokens: []int32{1, 2}, ResponseLength: 1, LossMask: []uint8{1}, RolloutLogProbs: []float32{-1}}); err != nil {
				return err
			}
			return enc.Close()
		})
		require.NoError(t, err)
		res, err := w.Commit(ctx, nil)
		require.NoError(t, err)

		lg := kiln(t, "log", "--store", sc.uri, res.Ref.String())
		require.Equal(t, 0, lg.Code, lg.Stderr)
		lines := strings.Split(strings.TrimSpace(lg.Stdout), "\n")
		require.Len(t, lines, 4, lg.Stdout)
		assert.Contains(t, lines[0], res.Ref.String()+" (trajectories, 1 rows) by rollout 1")
		assert.Contains(t, lines[1], "└── "+in.String()+" (tasks, 4 rows) by import-tasks")
		assert.Contains(t, lines[2], "    └── rows: /")
		assert.Contains(t, lines[2], "formats/records/testdata/reference-rows.jsonl")
		assert.Contains(t, lines[3], "latest of trajectories/step-0: "+res.Ref.String()+" (this version), moved by rollout on ")

		exp := kiln(t, "export", "--store", sc.uri, "trajectories/step-0")
		require.Equal(t, 0, exp.Code, exp.Stderr)
		assert.JSONEq(t, `{"rollout_id":0,"index":0,"group_index":0,"segment":0,"tokens":[1,2],"response_length":1,
			"loss_mask":[1],"rollout_log_probs":[-1],"truncated":false,"use_tool":false,"ill_formed":false,"reward":null}`, exp.Stdout)
	})
}

func TestHelpIsTheManual(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"import", "tasks", "--help"}, {"gc", "--help"},
		{"import", "turns", "--help"}, {"import", "rollouts", "--help"}, {"import", "grades", "--help"},
		{"verify", "--help"}, {"cat", "--help"}, {"forget", "--help"}, {"ls", "--help"}} {
		r := kiln(t, args...)
		require.Equal(t, 0, r.Code, "%v: %s", args, r.Stderr)
		assert.Contains(t, r.Stdout, "EXIT STATUS", args)
		assert.Contains(t, r.Stdout, "130  interrupted", args)
	}
}

func TestImportFromS3Object(t *testing.T) {
	v := storetest.VersityServer(t)
	for _, kv := range v.Env() {
		k, val, _ := strings.Cut(kv, "=")
		t.Setenv(k, val)
	}
	bucket := v.NewBucket(t)
	src := v.Open(t, "s3://"+bucket)
	put := func(rows string) {
		_, err := src.Put(context.Background(), "in/rows.jsonl", strings.NewReader(rows), int64(len(rows)))
		require.NoError(t, err)
	}
	dir := t.TempDir()
	put(`{"prompt": "a", "label": "t1", "metadata": {}}` + "\n")
	first := kiln(t, "import", "tasks", "--store", dir, "s3://"+bucket+"/in/rows.jsonl")
	require.Equal(t, 0, first.Code, first.Stderr)
	again := kiln(t, "import", "tasks", "--store", dir, "s3://"+bucket+"/in/rows.jsonl")
	assert.Equal(t, first.LastLine(), again.LastLine())
	put(`{"prompt": "b", "label": "t1", "metadata": {}}` + "\n")
	changed := kiln(t, "import", "tasks", "--store", dir, "s3://"+bucket+"/in/rows.jsonl")
	require.Equal(t, 0, changed.Code, changed.Stderr)
	assert.NotEqual(t, first.LastLine(), changed.LastLine(), "a changed object is a new version")
	lg := kiln(t, "log", "--store", dir, changed.LastLine())
	assert.Contains(t, lg.Stdout, "rows: s3://"+bucket+"/in/rows.jsonl (etag ")
	missing := kiln(t, "import", "tasks", "--store", dir, "s3://"+bucket+"/in/nope.jsonl")
	assert.Equal(t, stagecmd.ExitNotFound, missing.Code, missing.Stderr)
}
