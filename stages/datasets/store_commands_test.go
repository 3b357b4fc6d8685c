package datasets_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// makeVersion commits a version of name as a stage would: one shard from
// encode (rows rows, as the manifest will say), attachments put beside it
// before the commit, inputs recorded as lineage. seed varies the version id.
func makeVersion(t *testing.T, sc storeCase, name string, kind records.Kind, seed string, inputs []dataset.Ref,
	rows int64, encode func(io.Writer) error, attach map[string]string) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, sc.st, dataset.Spec{Name: name, Kind: kind,
		Identity: dataset.Identity{Stage: "fixture", CodeVersion: "1", Args: map[string]any{"seed": seed}, Inputs: inputs}})
	require.NoError(t, err)
	_, err = w.WriteShard(ctx, rows, nil, encode)
	require.NoError(t, err)
	for rel, body := range attach {
		_, err := sc.st.Put(ctx, dataset.AttachmentKey(w.Ref(), rel), strings.NewReader(body), int64(len(body)))
		require.NoError(t, err)
	}
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref
}

func gradesShard(grades ...records.Grade) func(io.Writer) error {
	return func(w io.Writer) error {
		enc := records.NewGradeEncoder(w)
		if err := enc.Write(grades...); err != nil {
			return err
		}
		return enc.Close()
	}
}

func tasksShard(ids ...string) func(io.Writer) error {
	return func(w io.Writer) error {
		enc := records.NewTaskEncoder(w)
		for i, id := range ids {
			if err := enc.Write(records.Task{TaskID: id, TaskIndex: int64(i), Prompt: `"p"`, Metadata: `{}`}); err != nil {
				return err
			}
		}
		return enc.Close()
	}
}

func oneGrade(task string) records.Grade {
	return records.Grade{TaskID: task, Failure: records.FailureTestsFailed, ExitCode: 1}
}

// manifestOf reads ref's manifest.
func manifestOf(t *testing.T, sc storeCase, ref string) *dataset.Version {
	t.Helper()
	v, err := dataset.OpenString(context.Background(), sc.st, ref)
	require.NoError(t, err)
	return v
}

func shardKey(v *dataset.Version, i int) string {
	return v.Dataset + "/_v/" + v.Version + "/" + v.Shards[i].Key
}

func TestVerify(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		good := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 1, 3)).LastLine()
		flipped := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/flipped", rowsFile(t, 2, 3)).LastLine()
		missing := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/missing", rowsFile(t, 3, 3)).LastLine()
		// Shards that hash right but are not what the manifest says.
		schema := makeVersion(t, sc, "tasks/schema", records.TasksKind(), "s", nil, 1, gradesShard(oneGrade("a")), nil)
		count := makeVersion(t, sc, "grades/count", records.GradesKind(), "c", nil, 5, gradesShard(oneGrade("a"), oneGrade("b")), nil)
		badManifest := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/manifest", rowsFile(t, 4, 1)).LastLine()

		v := manifestOf(t, sc, flipped)
		data, _, err := store.ReadAll(ctx, sc.st, shardKey(v, 0))
		require.NoError(t, err)
		data[len(data)/2] ^= 0xff
		_, err = sc.st.Put(ctx, shardKey(v, 0), bytes.NewReader(data), int64(len(data)))
		require.NoError(t, err)
		require.NoError(t, sc.st.Delete(ctx, shardKey(manifestOf(t, sc, missing), 0)))
		mv := manifestOf(t, sc, badManifest)
		mkey := mv.Dataset + "/_v/" + mv.Version + "/manifest.json"
		_, err = sc.st.Put(ctx, mkey, strings.NewReader("{not json"), 9)
		require.NoError(t, err)

		ok := kiln(t, "verify", "--store", sc.uri, good)
		require.Equal(t, 0, ok.Code, ok.Stderr)
		assert.Contains(t, ok.Stdout, "ok       "+good+" shards/")
		assert.Contains(t, ok.Stdout, good+": ok (1 shard(s), 3 rows, ")

		for _, c := range []struct {
			name string
			refs []string
			code int
			want []string // in stderr
		}{
			{"flipped byte", []string{flipped}, stagecmd.ExitCorrupt, []string{flipped, "does not match the manifest's", v.Shards[0].Key}},
			{"missing shard", []string{missing}, stagecmd.ExitCorrupt, []string{"is missing from"}},
			{"wrong schema", []string{schema.String()}, stagecmd.ExitCorrupt, []string{"its schema (sha256:", "differs from the tasks kind's"}},
			{"row count", []string{count.String()}, stagecmd.ExitCorrupt, []string{"holds 2 rows, the manifest says 5"}},
			{"corrupt manifest", []string{badManifest}, stagecmd.ExitCorrupt, []string{"is not valid JSON"}},
			{"good and bad", []string{good, flipped, missing}, stagecmd.ExitCorrupt, []string{"verify: 2 of 3 version(s) corrupt", flipped, missing}},
			{"no such version", []string{"tasks@0000"}, stagecmd.ExitNotFound, []string{"tasks@0000: not found"}},
			{"no refs", nil, stagecmd.ExitUsage, []string{"want REF... or --all"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := kiln(t, append([]string{"verify", "--store", sc.uri}, c.refs...)...)
				assert.Equal(t, c.code, r.Code, r.Stderr)
				for _, w := range c.want {
					assert.Contains(t, r.Stderr, w)
				}
			})
		}

		// --all looks at every version, past the corrupt ones.
		all := kiln(t, "verify", "--store", sc.uri, "--all")
		assert.Equal(t, stagecmd.ExitCorrupt, all.Code, all.Stderr)
		assert.Contains(t, all.Stdout, good+": ok")
		for _, ref := range []string{flipped, missing, schema.String(), count.String()} {
			assert.Contains(t, all.Stdout, ref+": CORRUPT (1 of 1 shard(s))")
		}
		assert.Contains(t, all.Stdout, "CORRUPT  "+badManifest+": ")
		assert.Contains(t, all.Stderr, "verify: 5 of 6 version(s) corrupt")
		prefix := kiln(t, "verify", "--store", sc.uri, "--all", "--prefix", "grades/")
		assert.Equal(t, stagecmd.ExitCorrupt, prefix.Code)
		assert.Contains(t, prefix.Stderr, "1 of 1 version(s)")
	})
}

func TestCat(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		log := `{"cmd": "pytest", "exit": 1}` + "\n" + strings.Repeat("é", 3000) + "\n"
		g := oneGrade("t-1")
		ref := makeVersion(t, sc, "grades/step-1", records.GradesKind(), "1", nil, 1, gradesShard(g),
			map[string]string{"logs/t-1.jsonl": log, "logs/t-2.jsonl": "two\n"})
		other := makeVersion(t, sc, "grades/step-1", records.GradesKind(), "2", nil, 1, gradesShard(g), nil)
		key := dataset.AttachmentKey(ref, "logs/t-1.jsonl")

		for _, c := range []struct {
			name string
			args []string
			code int
			out  string // stdout, exactly (code 0)
			err  string // in stderr
		}{
			{"by full key", []string{ref.String(), key}, 0, log, ""},
			{"by path", []string{ref.String(), "logs/t-2.jsonl"}, 0, "two\n", ""},
			{"by attachments path", []string{ref.String(), "attachments/logs/t-2.jsonl"}, 0, "two\n", ""},
			{"list", []string{"--list", ref.String()}, 0, "", ""},
			{"missing", []string{ref.String(), "logs/t-3.jsonl"}, stagecmd.ExitNotFound, "", `attachment "logs/t-3.jsonl": not found`},
			{"another version's key", []string{other.String(), key}, stagecmd.ExitUsage, "", "belongs to " + ref.String()},
			{"bare name and a key", []string{"grades/step-1", key}, 0, log, ""},
			{"dot dot", []string{ref.String(), "logs/../../manifest.json"}, stagecmd.ExitUsage, "", "inside the version's attachments"},
			{"no such version", []string{"grades/step-1@0000", "logs/t-1.jsonl"}, stagecmd.ExitNotFound, "", "not found"},
			{"one argument", []string{ref.String()}, stagecmd.ExitUsage, "", "want REF ATTACHMENT"},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := kiln(t, append([]string{"cat", "--store", sc.uri}, c.args...)...)
				require.Equal(t, c.code, r.Code, r.Stderr)
				if c.code != 0 {
					assert.Contains(t, r.Stderr, c.err)
					return
				}
				if c.name == "list" {
					lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
					require.Len(t, lines, 2, r.Stdout)
					assert.True(t, strings.HasPrefix(lines[0], "logs/t-1.jsonl\t"+itoa(len(log))+"\t"), lines[0])
					assert.True(t, strings.HasPrefix(lines[1], "logs/t-2.jsonl\t4\t"), lines[1])
					return
				}
				assert.Equal(t, c.out, r.Stdout)
			})
		}
	})
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// ls --shards names exactly one version's shard files, where other tools
// read them.
func TestLsShards(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		a := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 1, 2)).LastLine()
		b := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 2, 3)).LastLine()
		for _, ref := range []string{a, b} {
			r := kiln(t, "ls", "--store", sc.uri, "--shards", ref)
			require.Equal(t, 0, r.Code, r.Stderr)
			v := manifestOf(t, sc, ref)
			lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
			require.Len(t, lines, len(v.Shards))
			for i, uri := range lines {
				if sc.env == nil {
					// A local store: an absolute path with the shard's bytes.
					data, err := os.ReadFile(uri)
					require.NoError(t, err)
					sum := sha256.Sum256(data)
					assert.Equal(t, v.Shards[i].SHA256, hex.EncodeToString(sum[:]))
				} else {
					assert.Equal(t, strings.TrimSuffix(sc.uri, "/")+"/"+shardKey(v, i), uri)
					_, err := sc.st.Stat(ctx, shardKey(v, i))
					require.NoError(t, err)
				}
				assert.Contains(t, uri, "/_v/"+v.Version+"/shards/", "this version's shards only")
			}
		}
		js := kiln(t, "ls", "--store", sc.uri, "--shards", "--json", "tasks")
		require.Equal(t, 0, js.Code, js.Stderr)
		var row struct {
			URI, Key, SHA256 string
			Rows             int64
		}
		require.NoError(t, json.Unmarshal([]byte(strings.Split(js.Stdout, "\n")[0]), &row))
		assert.Equal(t, int64(3), row.Rows, "a bare name: the latest, b")
		assert.Contains(t, row.URI, strings.TrimPrefix(b, "tasks@"))

		for _, c := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"--shards"}, stagecmd.ExitUsage, "want REF (with --shards)"},
			{[]string{"--shards", "--all", a}, stagecmd.ExitUsage, "drop --all"},
			{[]string{"--shards", "tasks@0000"}, stagecmd.ExitNotFound, "not found"},
		} {
			r := kiln(t, append([]string{"ls", "--store", sc.uri}, c.args...)...)
			assert.Equal(t, c.code, r.Code, "%v: %s", c.args, r.Stderr)
			assert.Contains(t, r.Stderr, c.want)
		}
	})
}

// waitTick makes the next commit's store time differ from the last one's:
// S3 servers keep whole seconds.
func waitTick(sc storeCase) {
	if sc.env != nil {
		time.Sleep(1100 * time.Millisecond)
	}
}

// ls shows the version the bare name means, which after a rerun of an older
// stage is not the newest committed.
func TestLsShowsLatest(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		fileA := rowsFile(t, 1, 2)
		a := kiln(t, "import", "tasks", "--store", sc.uri, fileA).LastLine()
		waitTick(sc)
		b := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 2, 3)).LastLine()
		rerun := kiln(t, "import", "tasks", "--store", sc.uri, fileA)
		require.Equal(t, a, rerun.LastLine())
		va, vb := strings.TrimPrefix(a, "tasks@"), strings.TrimPrefix(b, "tasks@")

		ls := kiln(t, "ls", "--store", sc.uri)
		require.Equal(t, 0, ls.Code, ls.Stderr)
		lines := strings.Split(strings.TrimSpace(ls.Stdout), "\n")
		require.Len(t, lines, 2, ls.Stdout)
		assert.Regexp(t, `^DATASET +VERSION +KIND +ROWS +COMMITTED +VERSIONS +LATEST$`, lines[0])
		assert.Regexp(t, `^tasks +`+va+` +tasks +2 +\S+ +2 +latest$`, lines[1])

		all := kiln(t, "ls", "--store", sc.uri, "--all")
		lines = strings.Split(strings.TrimSpace(all.Stdout), "\n")
		require.Len(t, lines, 3, all.Stdout)
		assert.Regexp(t, `^tasks +`+vb+` +tasks +3 +\S+ +2 *$`, lines[1], "the newest committed, not latest")
		assert.Regexp(t, `^tasks +`+va+` +tasks +2 +\S+ +2 +latest$`, lines[2])

		js := kiln(t, "ls", "--store", sc.uri, "--json", "--all")
		var got []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(js.Stdout), "\n") {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &m))
			got = append(got, m)
		}
		require.Len(t, got, 2)
		assert.Equal(t, []any{vb, false, va, true}, []any{got[0]["version"], got[0]["latest"], got[1]["version"], got[1]["latest"]})

		// Without a pointer the bare name means the newest, and ls says so.
		require.NoError(t, sc.st.Delete(ctx, "tasks/_latest.json"))
		ls = kiln(t, "ls", "--store", sc.uri)
		assert.Regexp(t, `(?m)^tasks +`+vb+` +tasks +3 +\S+ +2 +newest$`, ls.Stdout)
	})
}

func TestGCGuards(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		neg := kiln(t, "gc", "--store", sc.uri, "--grace", "-1h")
		assert.Equal(t, stagecmd.ExitUsage, neg.Code, neg.Stderr)
		assert.Contains(t, neg.Stderr, "--grace -1h0m0s is negative")

		good := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 1, 2)).LastLine()
		bad := kiln(t, "import", "tasks", "--store", sc.uri, "--out", "tasks/bad", rowsFile(t, 2, 2)).LastLine()
		bv := manifestOf(t, sc, bad)
		badDir := bv.Dataset + "/_v/" + bv.Version + "/"
		_, err := sc.st.Put(ctx, badDir+"manifest.json", strings.NewReader("{}"), 2)
		require.NoError(t, err)
		// Debris: a losing attempt's shard in the corrupt version (kept,
		// since its manifest cannot say it is unneeded) and in the good one
		// (removed), and a version that never committed (removed).
		gv := manifestOf(t, sc, good)
		for _, k := range []string{badDir + "shards/p00000-zzz-00000.parquet", gv.Dataset + "/_v/" + gv.Version + "/shards/p00000-zzz-00000.parquet", "tasks/_v/0123456789abcdefabcd/shards/p00000-zzz-00000.parquet"} {
			_, err := sc.st.Put(ctx, k, strings.NewReader("x"), 1)
			require.NoError(t, err)
		}
		waitTick(sc)
		r := kiln(t, "gc", "--store", sc.uri, "--grace", "0s")
		assert.Equal(t, stagecmd.ExitCorrupt, r.Code, r.Stderr)
		assert.Contains(t, r.Stderr, "kept every file of "+badDir)
		assert.Contains(t, r.Stdout, "removed "+gv.Dataset+"/_v/"+gv.Version+"/shards/p00000-zzz-00000.parquet (unreferenced")
		assert.Contains(t, r.Stdout, "removed tasks/_v/0123456789abcdefabcd/shards/p00000-zzz-00000.parquet (uncommitted")
		assert.NotContains(t, r.Stdout, badDir)
		_, err = sc.st.Stat(ctx, badDir+"shards/p00000-zzz-00000.parquet")
		assert.NoError(t, err, "nothing is removed around a manifest gc cannot read")
		assert.Equal(t, 0, kiln(t, "verify", "--store", sc.uri, good).Code, "the good version is whole")
	})
}

// versionFiles counts the store's files under name's version dirs.
func versionFiles(t *testing.T, sc storeCase, ref string) int {
	t.Helper()
	r, err := dataset.ParseRef(ref)
	require.NoError(t, err)
	n := 0
	require.NoError(t, sc.st.List(context.Background(), r.Name+"/_v/"+r.Version+"/", func(store.Info) error { n++; return nil }))
	return n
}

func TestForget(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		// tasks: v1, v2, v3 imported; v4 made from v2; then v1 made again,
		// so latest is v1, the oldest committed. rollouts/x is made from v3.
		file1 := rowsFile(t, 1, 2)
		v1 := kiln(t, "import", "tasks", "--store", sc.uri, file1).LastLine()
		waitTick(sc)
		v2 := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 2, 2)).LastLine()
		waitTick(sc)
		v3 := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 3, 2)).LastLine()
		waitTick(sc)
		r2, _ := dataset.ParseRef(v2)
		r3, _ := dataset.ParseRef(v3)
		v4 := makeVersion(t, sc, "tasks", records.TasksKind(), "4", []dataset.Ref{r2}, 1, tasksShard("a"),
			map[string]string{"logs/a.jsonl": "log\n"}).String()
		rollouts := makeVersion(t, sc, "rollouts/x", records.GradesKind(), "x", []dataset.Ref{r3}, 1, gradesShard(oneGrade("a")), nil)
		require.Equal(t, v1, kiln(t, "import", "tasks", "--store", sc.uri, file1).LastLine())
		require.Equal(t, v1, latestVersion(t, sc, "tasks"))

		dry := kiln(t, "forget", "--store", sc.uri, "-n", "--keep-last", "1", "tasks")
		require.Equal(t, 0, dry.Code, dry.Stderr)
		lines := strings.Split(strings.TrimSpace(dry.Stdout), "\n")
		require.Len(t, lines, 5, dry.Stdout)
		assert.Regexp(t, `^keep +`+v4+` +\S+ +\(last 1\)$`, lines[0])
		assert.Regexp(t, `^would forget `+v3+` +\S+ +\(\d+ files, \d+ bytes\)$`, lines[1])
		assert.Regexp(t, `^keep +`+v2+` +\S+ +\(lineage of `+v4+`\)$`, lines[2])
		assert.Regexp(t, `^keep +`+v1+` +\S+ +\(latest\)$`, lines[3])
		assert.Regexp(t, `^would forget 1 version\(s\), \d+ file\(s\), \d+ bytes; kept 3$`, lines[4])
		assert.NotZero(t, versionFiles(t, sc, v3), "a dry run removes nothing")

		refd := kiln(t, "forget", "--store", sc.uri, "-n", "--keep-referenced", "--keep-last", "1", "tasks")
		require.Equal(t, 0, refd.Code, refd.Stderr)
		assert.Regexp(t, `(?m)^keep +`+v3+` +\S+ +\(referenced of `+rollouts.String()+`\)$`, refd.Stdout)

		before := versionFiles(t, sc, v3)
		real := kiln(t, "forget", "--store", sc.uri, "--keep-last", "1", "tasks")
		require.Equal(t, 0, real.Code, real.Stderr)
		assert.Regexp(t, `(?m)^forget +`+v3+` +\S+ +\(`+itoa(before)+` files, \d+ bytes\)$`, real.Stdout)
		assert.Regexp(t, `forgot 1 version\(s\), `+itoa(before)+` file\(s\), \d+ bytes; kept 3\n$`, real.Stdout)
		assert.Zero(t, versionFiles(t, sc, v3), "the version goes whole")
		assert.Equal(t, stagecmd.ExitNotFound, kiln(t, "show", "--store", sc.uri, v3).Code)
		for _, kept := range []string{v1, v2, v4} {
			assert.Equal(t, 0, kiln(t, "verify", "--store", sc.uri, kept).Code, kept)
		}
		assert.Equal(t, v1, latestVersion(t, sc, "tasks"))
		lg := kiln(t, "log", "--store", sc.uri, rollouts.String())
		assert.Contains(t, lg.Stdout, v3+" (unreadable: ", "another dataset's input, forgotten without --keep-referenced")
		gc := kiln(t, "gc", "--store", sc.uri, "--grace", "0s", "-n")
		assert.NotContains(t, gc.Stdout, "tasks/_v/"+r3.Version+"/", "forget leaves nothing behind")

		// --keep-last 0 keeps only latest (v4 goes, and with it v2's reason).
		zero := kiln(t, "forget", "--store", sc.uri, "--keep-last", "0", "tasks")
		require.Equal(t, 0, zero.Code, zero.Stderr)
		assert.Contains(t, zero.Stdout, "forgot 2 version(s)")
		assert.Zero(t, versionFiles(t, sc, v4))
		assert.Zero(t, versionFiles(t, sc, v2))
		assert.NotZero(t, versionFiles(t, sc, v1), "never the version latest names")
		all, err := dataset.List(ctx, sc.st, "tasks")
		require.NoError(t, err)
		require.Len(t, all, 1)

		for _, c := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"tasks"}, stagecmd.ExitUsage, "--keep-last N is required"},
			{[]string{"--keep-last", "-1", "tasks"}, stagecmd.ExitUsage, "--keep-last -1 is negative"},
			{[]string{"--keep-last", "1", v1}, stagecmd.ExitUsage, "want a dataset NAME, not a version"},
			{[]string{"--keep-last", "1", "nope"}, stagecmd.ExitNotFound, "forget nope: not found"},
		} {
			r := kiln(t, append([]string{"forget", "--store", sc.uri}, c.args...)...)
			assert.Equal(t, c.code, r.Code, "%v: %s", c.args, r.Stderr)
			assert.Contains(t, r.Stderr, c.want)
		}
	})
}

// forget removes nothing when it cannot read what it needs to decide.
func TestForgetRefusesOnUnreadableLineage(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		a := kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 1, 2)).LastLine()
		waitTick(sc)
		kiln(t, "import", "tasks", "--store", sc.uri, rowsFile(t, 2, 2))
		other := makeVersion(t, sc, "rollouts/x", records.GradesKind(), "x", nil, 1, gradesShard(oneGrade("a")), nil)
		_, err := sc.st.Put(ctx, "rollouts/x/_v/"+other.Version+"/manifest.json", strings.NewReader("{"), 1)
		require.NoError(t, err)
		r := kiln(t, "forget", "--store", sc.uri, "--keep-referenced", "--keep-last", "1", "tasks")
		assert.Equal(t, stagecmd.ExitCorrupt, r.Code, r.Stderr)
		assert.Contains(t, r.Stderr, "cannot read the lineage of "+other.String()+", so nothing was removed")
		assert.NotZero(t, versionFiles(t, sc, a))

		_, err = sc.st.Put(ctx, "tasks/_latest.json", strings.NewReader("{"), 1)
		require.NoError(t, err)
		r = kiln(t, "forget", "--store", sc.uri, "--keep-last", "1", "tasks")
		assert.Equal(t, stagecmd.ExitCorrupt, r.Code, r.Stderr)
		assert.Contains(t, r.Stderr, "cannot tell which version is latest")
		assert.NotZero(t, versionFiles(t, sc, a))
	})
}

// TestForgetRefusesDanglingLatest: forget refuses (exit 4, nothing removed)
// while latest names a version that is not committed (issue 31: a pointer
// hand-edited to a missing version made forget delete every version).
func TestForgetRefusesDanglingLatest(t *testing.T) {
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	for i := range 2 {
		r := kiln(t, "import", "tasks", "--store", storeDir, rowsFile(t, i+1, 2))
		require.Equal(t, 0, r.Code, r.Stderr)
	}
	pointer := filepath.Join(storeDir, "tasks", "_latest.json")
	b, err := os.ReadFile(pointer)
	require.NoError(t, err)
	var l map[string]any
	require.NoError(t, json.Unmarshal(b, &l))
	l["version"] = "0123456789abcdef0123"
	b, err = json.Marshal(l)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(pointer, b, 0o644))
	r := kiln(t, "forget", "--store", storeDir, "--keep-last", "0", "tasks")
	assert.Equal(t, stagecmd.ExitCorrupt, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, "its latest pointer names tasks@0123456789abcdef0123, which is not committed, so nothing was removed")
	vs, err := dataset.List(context.Background(), mustLocal(t, storeDir), "tasks")
	require.NoError(t, err)
	assert.Len(t, vs, 2, "nothing was removed")
}
